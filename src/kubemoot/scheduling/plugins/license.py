"""License: a Model that declares a license must be ALLOW to be placed."""

from __future__ import annotations

from typing import Self

from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["LicenseGate"]

_NAME = "License"
_UNDECLARED = GateResult.pass_(_NAME, "the Model declares no license state")
_ALLOW = GateResult.pass_(_NAME, "license is ALLOW", field="spec.license", value="ALLOW")


class LicenseGate:
    """REVIEW_REQUIRED and BLOCKED fail: permission is a gate, never a preference."""

    name = _NAME

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls()

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        state = candidate.model.spec.license
        return Verdict.PASS if state is None or state == "ALLOW" else Verdict.FAIL

    def check(self, candidate: Placement, /) -> GateResult:
        state = candidate.model.spec.license
        if state is None:
            return _UNDECLARED
        if state == "ALLOW":
            return _ALLOW
        return GateResult.fail(
            self.name, f"license is {state}, not ALLOW", field="spec.license", value=state
        )
