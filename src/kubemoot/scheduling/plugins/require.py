"""Require: the phase rule's hard label selector (nodeSelector's counterpart)."""

from __future__ import annotations

from typing import Self

from kubemoot.api import SchedulingRule
from kubemoot.gates import GateResult
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["RequireGate"]


class RequireGate:
    """PASS when the Model's labels satisfy ``rule.require``; a rule without one admits all."""

    name = "Require"

    def __init__(self, rule: SchedulingRule | None) -> None:
        self._rule = rule
        selector = "{}" if rule is None or rule.require is None else rule.require.describe()
        # One result object per verdict: the scheduler checks every (rule, model) pair,
        # and the evidence is the same for every Model under one rule.
        self._pass = GateResult.pass_(self.name, f"labels match {selector}", selector=selector)
        self._fail = GateResult.fail(
            self.name, f"labels do not match {selector}", selector=selector
        )

    @property
    def passed(self) -> GateResult:
        """The result every admitted Model gets."""
        return self._pass

    @property
    def failed(self) -> GateResult:
        """The result every rejected Model gets."""
        return self._fail

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(args.rule)

    def check(self, candidate: Placement, /) -> GateResult:
        rule = self._rule
        if rule is None or rule.admits(candidate.model.metadata.labels):
            return self._pass
        return self._fail
