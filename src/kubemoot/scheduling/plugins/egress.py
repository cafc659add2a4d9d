"""Egress: a Model that must not reach the network may only run where egress is none."""

from __future__ import annotations

from typing import Self

from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["EgressGate"]

_NAME = "Egress"
_NO_CONSTRAINT = GateResult.pass_(_NAME, "the Model does not forbid egress")


class EgressGate:
    """``spec.egress: none`` needs a provider whose ``spec.policy.egress`` is none.

    A provider that declares no egress policy is UNKNOWN: absence of a policy is not
    evidence that the network is closed.
    """

    name = _NAME

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls()

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        if candidate.model.spec.egress != "none":
            return Verdict.PASS
        provider = candidate.provider
        policy = None if provider is None else provider.spec.policy
        egress = None if policy is None else policy.egress
        if egress is None:
            return Verdict.UNKNOWN
        return Verdict.PASS if egress == "none" else Verdict.FAIL

    def check(self, candidate: Placement, /) -> GateResult:
        if candidate.model.spec.egress != "none":
            return _NO_CONSTRAINT
        provider = candidate.provider
        if provider is None:
            return GateResult.unknown(self.name, "no provider, so no egress policy")
        policy = provider.spec.policy
        egress = None if policy is None else policy.egress
        name = provider.metadata.name
        if egress is None:
            return GateResult.unknown(
                self.name,
                f"provider {name} declares no egress policy; the Model needs egress none",
                field="spec.policy.egress",
            )
        if egress == "none":
            return GateResult.pass_(
                self.name, f"provider {name} allows no egress", field="spec.policy.egress"
            )
        return GateResult.fail(
            self.name,
            f"the Model needs egress none; provider {name} allows egress",
            field="spec.policy.egress",
            value=egress,
        )
