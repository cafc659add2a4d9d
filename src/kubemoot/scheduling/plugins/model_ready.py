"""ModelReady: a Model whose status says it is not ready is out; no status means Ready."""

from __future__ import annotations

from typing import Self

from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["ModelReadyGate"]

_NAME = "ModelReady"
_PASS, _FAIL = Verdict.PASS, Verdict.FAIL
_NO_STATUS = GateResult.pass_(_NAME, "no Model status: a declared Model is taken as Ready")
_READY = GateResult.pass_(_NAME, "Model status is ready", field="status.ready")
_NOT_READY = GateResult.fail(_NAME, "Model status is not ready", field="status.ready", value=False)


class ModelReadyGate:
    """Only ``status.ready: false`` fails; a hand-written bundle carries no status."""

    name = _NAME

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls()

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        status = candidate.model.status
        return _FAIL if status is not None and status.ready is False else _PASS

    def check(self, candidate: Placement, /) -> GateResult:
        status = candidate.model.status
        if status is None or status.ready is None:
            return _NO_STATUS
        return _READY if status.ready else _NOT_READY
