"""TopologySpread: a later phase of an Agent avoids topology values its earlier phases use."""

from __future__ import annotations

from typing import Self

from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs, SpreadContext, topology_value

__all__ = ["TopologySpreadGate"]

_NAME = "TopologySpread"
_NOT_CONSTRAINED = GateResult.pass_(_NAME, "no spread constraint for this phase")


class TopologySpreadGate:
    """``DoNotSchedule``: a used value FAILs. ``ScheduleAnyway``: it FAILs only while a
    feasible candidate elsewhere exists, so the phase falls back to the best binding."""

    name = _NAME

    def __init__(self, spread: SpreadContext | None) -> None:
        self._spread = spread

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(args.spread)

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        spread = self._spread
        if spread is None or not spread.used:
            return Verdict.PASS
        value = topology_value(candidate, spread.topology_key)
        if value is None or value not in spread.used:
            return Verdict.PASS
        if spread.when_unsatisfiable == "DoNotSchedule" or spread.alternatives:
            return Verdict.FAIL
        return Verdict.PASS

    def check(self, candidate: Placement, /) -> GateResult:
        spread = self._spread
        if spread is None or not spread.used:
            return _NOT_CONSTRAINED
        value = topology_value(candidate, spread.topology_key)
        key = spread.topology_key
        if value is None or value not in spread.used:
            return GateResult.pass_(
                self.name, f"{key}={value} is not used by an earlier phase", topologyKey=key
            )
        if spread.when_unsatisfiable == "DoNotSchedule":
            return GateResult.fail(
                self.name,
                f"{key}={value} already serves an earlier phase (DoNotSchedule)",
                topologyKey=key,
                value=value,
            )
        if spread.alternatives:
            return GateResult.fail(
                self.name,
                f"{key}={value} already serves an earlier phase; a feasible candidate "
                "elsewhere exists",
                topologyKey=key,
                value=value,
            )
        return GateResult.pass_(
            self.name,
            f"{key}={value} already serves an earlier phase, but nothing feasible lies "
            "elsewhere (ScheduleAnyway)",
            topologyKey=key,
            value=value,
        )
