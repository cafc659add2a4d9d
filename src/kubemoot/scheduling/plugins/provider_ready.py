"""ProviderReady: the Model's providerRef resolves to a provider that reports ready."""

from __future__ import annotations

from datetime import datetime
from typing import Self

from kubemoot.api import ModelProvider
from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement, stale_age
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["ProviderReadyGate"]


class ProviderReadyGate:
    """Missing provider → FAIL; readiness not reported → UNKNOWN; not ready → FAIL.

    A "not ready" read from a stale status is STALE instead of FAIL: old evidence can
    make a candidate uncertain, never decisively out.
    """

    name = "ProviderReady"

    def __init__(self, *, now: datetime, max_age_seconds: int) -> None:
        self._now = now
        self._max_age = max_age_seconds
        # The verdict depends on the provider alone; many Models share one provider.
        # Keyed by identity; the entry keeps the provider alive so the id stays its own.
        self._by_provider: dict[tuple[str, int], tuple[ModelProvider, GateResult]] = {}

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(now=args.now, max_age_seconds=args.max_age_seconds)

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        provider = candidate.provider
        if provider is None:
            return Verdict.FAIL
        status = provider.status
        if status is None or status.ready is None:
            return Verdict.UNKNOWN
        if status.ready:
            return Verdict.PASS
        if stale_age(provider, self._now, self._max_age) is not None:
            return Verdict.STALE
        return Verdict.FAIL

    def check(self, candidate: Placement, /) -> GateResult:
        provider = candidate.provider
        if provider is None:
            return self._judge(candidate)
        key = (candidate.model.spec.provider_ref, id(provider))
        found = self._by_provider.get(key)
        if found is None:
            found = self._by_provider[key] = (provider, self._judge(candidate))
        return found[1]

    def _judge(self, candidate: Placement) -> GateResult:
        ref = candidate.model.spec.provider_ref
        provider = candidate.provider
        if provider is None:
            return GateResult.fail(
                self.name,
                f'providerRef "{ref}" does not resolve to a ModelProvider',
                field="spec.providerRef",
                value=ref,
            )
        status = provider.status
        if status is None or status.ready is None:
            return GateResult.unknown(
                self.name, f"provider {ref} has not reported readiness", field="status.ready"
            )
        if status.ready:
            return GateResult.pass_(self.name, f"provider {ref} is ready", field="status.ready")
        age = stale_age(provider, self._now, self._max_age)
        if age is not None:
            return GateResult.stale(
                self.name,
                f"provider {ref} was not ready {age:.0f}s ago; the status is too old to trust",
                field="status.ready",
                ageSeconds=round(age, 3),
            )
        return GateResult.fail(
            self.name, f"provider {ref} is not ready", field="status.ready", value=False
        )
