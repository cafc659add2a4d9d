"""Digest: the artifact a Model pins must not be quarantined or shadowed on the provider."""

from __future__ import annotations

from typing import Self

from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["DigestGate"]

_NAME = "Digest"
_UNPINNED = GateResult.pass_(_NAME, "the Model pins no digest")


class DigestGate:
    """Quarantined digest or a loaded copy with another digest → FAIL; otherwise PASS.

    The quarantine list is part of the provider's spec, so its absence of the digest is
    evidence. When the provider reports the digests it holds and the Model's is not among
    them, the model would be pulled: PASS without locality (``evidence.local`` False).
    """

    name = _NAME

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls()

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        digest = candidate.model.spec.digest
        if digest is None:
            return Verdict.PASS
        provider = candidate.provider
        if provider is None:
            return Verdict.UNKNOWN
        if digest in provider.spec.quarantined_digests:
            return Verdict.FAIL
        capacity = provider.capacity
        for loaded in () if capacity is None else capacity.loaded_models:
            if (
                loaded.digest is not None
                and loaded.name == candidate.model_id
                and loaded.digest != digest
            ):
                return Verdict.FAIL
        return Verdict.PASS

    def check(self, candidate: Placement, /) -> GateResult:
        digest = candidate.model.spec.digest
        if digest is None:
            return _UNPINNED
        provider = candidate.provider
        if provider is None:
            return GateResult.unknown(self.name, "no provider, so no artifact evidence")
        name = provider.metadata.name
        if digest in provider.spec.quarantined_digests:
            return GateResult.fail(
                self.name,
                f"digest {digest} is quarantined on provider {name}",
                field="spec.quarantinedDigests",
                digest=digest,
            )
        capacity = provider.capacity
        held: set[str] = set() if capacity is None else set(capacity.digests)
        for loaded in () if capacity is None else capacity.loaded_models:
            if loaded.digest is None:
                continue
            held.add(loaded.digest)
            if loaded.name == candidate.model_id and loaded.digest != digest:
                return GateResult.fail(
                    self.name,
                    f"provider {name} holds {loaded.name} with digest {loaded.digest}, "
                    f"not {digest}",
                    field="status.capacity.loadedModels",
                    digest=digest,
                    held=loaded.digest,
                )
        if digest in held:
            return GateResult.pass_(
                self.name, f"provider {name} holds {digest}", digest=digest, local=True
            )
        if held:
            return GateResult.pass_(
                self.name,
                f"provider {name} does not hold {digest}; it would be pulled",
                digest=digest,
                local=False,
            )
        return GateResult.pass_(
            self.name,
            f"not quarantined on provider {name}; it reports no digests it holds",
            digest=digest,
            local=False,
        )
