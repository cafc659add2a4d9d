"""The scheduling framework: gates in order, scores over feasible candidates, weights.

Plugins are small and know nothing of each other (:mod:`kubemoot.scheduling.plugins`);
this module applies the rules. The decision itself is the gates engine's
(:func:`kubemoot.gates.evaluate`): hard gates first, scores only for feasible
candidates, bounded scores checked, weights applied, PLACE / DEFER / UNSCHEDULABLE.

Most of a decision does not depend on the Agent, so the framework computes it once and
shares it (kube-scheduler caches node info the same way):

* *provider tier* — every gate whose verdict depends only on the Model and its provider
  (readiness, freshness, VRAM, license, egress, digest, parallelism with nothing
  assumed), once per pass and freshness limit;
* *rule tier* — the Require gate, once per (policy, phase);
* *ranking* — quality + capacity + locality + provider weight of each statically
  feasible candidate, once per (policy, phase, effective bias).

Only the parallelism gate (agents bound earlier in the pass) and topology spread (the
Agent's earlier phases) are per Agent; the scheduler applies them while walking the
ranking. :meth:`Framework.decide` replays the whole decision through the engine with
those per-Agent gates, and the tests check that it agrees with the fast path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from kubemoot import __version__
from kubemoot.api import SchedulerSettings, SchedulingRule
from kubemoot.gates import DecisionRecord, Gate, GateResult, Verdict, Weighted, evaluate
from kubemoot.scheduling.candidate import Placement, stale_age
from kubemoot.scheduling.plugins import (
    GATES,
    SCORERS,
    CapacityScorer,
    ImageLocalityScorer,
    ParallelismGate,
    PluginArgs,
    ProviderWeightScorer,
    RequireGate,
    SpreadContext,
    TopologySpreadGate,
    agent_limit,
    quality_score,
    topology_value,
)

__all__ = [
    "AGENT_GATES",
    "PROVIDER_GATES",
    "SCHEDULER_VERSION",
    "SCORING_POLICY_VERSION",
    "Framework",
    "Ranked",
    "Ranking",
    "RuleTable",
    "tie_break",
]

SCHEDULER_VERSION = f"kubemoot-scheduler/{__version__}"
SCORING_POLICY_VERSION = "quality+capacity+imageLocality+providerWeight/v1"

#: Gates that depend on the Agent; everything else is shared.
AGENT_GATES = (ParallelismGate.name, TopologySpreadGate.name)
#: Gates that depend on the Model and its provider only.
PROVIDER_GATES = tuple(name for name in GATES if name not in (RequireGate.name, *AGENT_GATES))

_FAIL, _PASS = Verdict.FAIL, Verdict.PASS
FEASIBLE, UNCERTAIN, FAILED = 0, 1, 2


def tie_break(placement: Placement) -> tuple[bool, int, str]:
    """Equal scores: smaller declared vramMib first (undeclared last), then Model name."""
    declared = placement.model.spec.vram_mib
    return (declared is None, declared or 0, placement.name)


def standing_of(results: Sequence[GateResult]) -> int:
    """FEASIBLE, UNCERTAIN or FAILED by the engine's rule (any FAIL wins)."""
    verdicts = {result.result for result in results}
    if _FAIL in verdicts:
        return FAILED
    return FEASIBLE if verdicts == {_PASS} or not verdicts else UNCERTAIN


@dataclass(frozen=True, slots=True)
class ProviderFacts:
    """What the per-Agent parallelism check needs about one provider, precomputed."""

    headroom: int | None  # agents that may still be assumed onto it; None = limit unknown
    stale: bool


@dataclass(slots=True)
class ProviderTier:
    """Provider-tier gate results of every Model, for one freshness limit."""

    max_age_seconds: int
    results: dict[str, tuple[GateResult, ...]]
    standing: dict[str, int]
    facts: dict[str, ProviderFacts]
    first_fail: dict[str, GateResult]  # first FAIL among the provider-tier gates, if any


@dataclass(slots=True)
class RuleTable:
    """One (policy, phase): the Require result of every Model and the static standing."""

    phase: str
    rule: SchedulingRule | None
    tier: ProviderTier
    require: dict[str, GateResult]
    standing: dict[str, int]  # Require and provider tier together
    first_fail: dict[str, GateResult]  # Require's FAIL, else the provider tier's first
    feasible: list[Placement]  # statically feasible, by name
    uncertain: list[Placement]  # statically uncertain, by name
    admitted: list[Placement]  # Ready Models the require admits (candidate lists)
    rankings: dict[float | None, Ranking] = field(default_factory=dict)
    rows: list[_Row] | None = None


@dataclass(frozen=True, slots=True)
class Ranked:
    """One statically feasible candidate with its total score."""

    placement: Placement
    score: float
    provider: str
    topology: str | None


#: (name, tie-break, capacity, locality, provider weight, Ranked without score)
_Row = tuple[str, tuple[bool, int, str], float, float, float, Ranked]


@dataclass(frozen=True, slots=True)
class Ranking:
    """A rule table's feasible candidates for one effective bias, best first."""

    table: RuleTable
    bias: float | None
    bias_active: bool
    entries: tuple[Ranked, ...]
    quality: Mapping[str, float]  # quality score of every admitted Model, by name


class Framework:
    """The shared, agent-independent part of one scheduling pass."""

    def __init__(
        self,
        placements: Sequence[Placement],
        *,
        now: datetime,
        settings: SchedulerSettings | None = None,
    ) -> None:
        self.placements = tuple(placements)
        self.now = now
        self.settings = settings or SchedulerSettings()
        self.weights: Mapping[str, float] = MappingProxyType(
            {
                "Quality": 1.0,
                "Capacity": 1.0,
                # The locality scorer says 0 or 100; the weight turns it into the bonus.
                "ImageLocality": self.settings.image_locality_bonus / 100.0,
                "ProviderWeight": 1.0,
            }
        )
        self._tiers: dict[int, ProviderTier] = {}
        #: Agents each provider may still take in this pass (limit − reported − 1).
        self.headroom: dict[str, int] = {}
        for placement in self.placements:
            provider = placement.provider
            if provider is None:
                continue
            limit = agent_limit(provider, self.settings.concurrency_factor)
            if limit is not None:
                capacity = provider.capacity
                reported = (None if capacity is None else capacity.agent_count) or 0
                self.headroom[provider.metadata.name] = limit - reported - 1
        self._static_scores: dict[str, dict[str, tuple[float, float, float]]] = {}

    # ------------------------------------------------------------------ shared tiers

    def args(self, **context: Any) -> PluginArgs:
        """Plugin context for this pass, plus ``context``."""
        return PluginArgs(now=self.now, settings=self.settings, **context)

    def tier(self, max_age_seconds: int) -> ProviderTier:
        """Provider-tier results for a freshness limit, computed once."""
        found = self._tiers.get(max_age_seconds)
        if found is not None:
            return found
        gates = [GATES[name](self.args(max_age_seconds=max_age_seconds)) for name in PROVIDER_GATES]
        # Parallelism with nothing assumed yet: an unknown limit or a provider already full
        # by its own report is agent-independent; later bindings can only add FAILs.
        base_parallelism = ParallelismGate.from_args(self.args(max_age_seconds=max_age_seconds))
        results: dict[str, tuple[GateResult, ...]] = {}
        standing: dict[str, int] = {}
        for placement in self.placements:
            checked = tuple(gate.check(placement) for gate in gates)
            results[placement.name] = checked
            standing[placement.name] = standing_of((*checked, base_parallelism.check(placement)))
        facts: dict[str, ProviderFacts] = {}
        for placement in self.placements:
            provider = placement.provider
            if provider is None or provider.metadata.name in facts:
                continue
            facts[provider.metadata.name] = ProviderFacts(
                headroom=self.headroom.get(provider.metadata.name),
                stale=stale_age(provider, self.now, max_age_seconds) is not None,
            )
        first_fail = {
            name: next(r for r in checked if r.result is _FAIL)
            for name, checked in results.items()
            if standing[name] == FAILED and any(r.result is _FAIL for r in checked)
        }
        tier = ProviderTier(max_age_seconds, results, standing, facts, first_fail)
        self._tiers[max_age_seconds] = tier
        return tier

    def rule_table(
        self, phase: str, rule: SchedulingRule | None, *, max_age_seconds: int
    ) -> RuleTable:
        """Require results and static standing of every Model for one rule."""
        tier = self.tier(max_age_seconds)
        require_gate = RequireGate(rule)
        require: dict[str, GateResult] = {}
        standing: dict[str, int] = {}
        feasible: list[Placement] = []
        uncertain: list[Placement] = []
        admitted: list[Placement] = []
        first_fail = dict(tier.first_fail)
        tier_standing = tier.standing
        for placement in self.placements:
            name = placement.name
            result = require_gate.check(placement)
            require[name] = result
            if result.result is _FAIL:
                standing[name] = FAILED
                first_fail[name] = result
                continue
            if placement.model.is_ready:
                admitted.append(placement)
            state = tier_standing[name]
            standing[name] = state
            if state == FEASIBLE:
                feasible.append(placement)
            elif state == UNCERTAIN:
                uncertain.append(placement)
        return RuleTable(
            phase, rule, tier, require, standing, first_fail, feasible, uncertain, admitted
        )

    def static_terms(self, placement: Placement, phase: str) -> tuple[float, float, float]:
        """Weighted capacity, locality and provider-weight terms: agent-independent."""
        per_phase = self._static_scores.setdefault(phase, {})
        found = per_phase.get(placement.name)
        if found is None:
            weights = self.weights
            found = (
                weights["Capacity"] * CapacityScorer(self.settings.strategy).score(placement),
                weights["ImageLocality"] * ImageLocalityScorer().score(placement),
                weights["ProviderWeight"] * ProviderWeightScorer(phase).score(placement),
            )
            per_phase[placement.name] = found
        return found

    def ranking(
        self,
        table: RuleTable,
        *,
        bias: float | None,
        bias_active: bool,
        topology_key: str | None,
    ) -> Ranking:
        """The table's feasible candidates ranked for one effective bias, computed once."""
        # With a prefer block (or no active bias) the bias changes nothing: share one ranking.
        key = bias if bias_active and not (table.rule and table.rule.prefer) else None
        found = table.rankings.get(key)
        if found is not None:
            return found
        rule = table.rule
        quality = {
            p.name: quality_score(
                p.model.metadata.labels, rule, bias=key, bias_active=key is not None
            )
            for p in table.admitted
        }
        if table.rows is None:
            table.rows = self._rows(table, topology_key)
        weight_q = self.weights["Quality"]
        entries = [
            # Summed in the engine's order so that totals tie exactly as in the record.
            (-round(quality[name] * weight_q + capacity + locality + weight, 9), tie, row)
            for name, tie, capacity, locality, weight, row in table.rows
        ]
        entries.sort(key=lambda item: (item[0], item[1]))
        ranked = tuple(
            Ranked(row.placement, -total, row.provider, row.topology) for total, _, row in entries
        )
        ranking = Ranking(table, key, key is not None, ranked, quality)
        table.rankings[key] = ranking
        return ranking

    def _rows(self, table: RuleTable, topology_key: str | None) -> list[_Row]:
        """Agent-independent score terms of the table's feasible candidates."""
        rows: list[_Row] = []
        for placement in table.feasible:
            capacity, locality, weight = self.static_terms(placement, table.phase)
            provider = placement.model.spec.provider_ref
            topology = None if topology_key is None else topology_value(placement, topology_key)
            rows.append(
                (
                    placement.name,
                    tie_break(placement),
                    capacity,
                    locality,
                    weight,
                    Ranked(placement, 0.0, provider, topology),
                )
            )
        return rows

    # ------------------------------------------------------------------ full decisions

    def decide(
        self,
        ranking: Ranking,
        *,
        subject: str,
        assumed: Mapping[str, int],
        spread: SpreadContext | None,
    ) -> DecisionRecord:
        """The complete decision record for one Agent's phase, through the gates engine.

        Shared tiers are replayed from their cached results; the per-Agent gates run
        afresh with the assumed bindings and spread state the Agent saw.
        """
        table = ranking.table
        tier = table.tier
        args = self.args(
            phase=table.phase,
            rule=table.rule,
            max_age_seconds=tier.max_age_seconds,
            bias=ranking.bias,
            bias_active=ranking.bias_active,
            assumed=assumed,
            spread=spread,
        )
        gates: list[Gate[Placement]] = []
        for name in GATES:
            if name == RequireGate.name:
                gates.append(_Replay(name, table.require))
            elif name in AGENT_GATES:
                gates.append(GATES[name](args))
            else:
                index = PROVIDER_GATES.index(name)
                gates.append(_Replay(name, {k: v[index] for k, v in tier.results.items()}))
        scorers: list[Weighted[Placement]] = []
        for name, factory in SCORERS.items():
            scorer = factory(args)
            bounded = bool(getattr(scorer, "bounded", True))
            scorers.append(Weighted(scorer, self.weights[name], bounded))
        return evaluate(
            self.placements,
            key=lambda placement: placement.name,
            gates=gates,
            scorers=scorers,
            tie_break=tie_break,
            subject=subject,
            scheduler_version=SCHEDULER_VERSION,
            scoring_policy_version=SCORING_POLICY_VERSION,
        )


class _Replay:
    """A gate whose results were computed earlier in the pass (shared tiers)."""

    def __init__(self, name: str, results: Mapping[str, GateResult]) -> None:
        self.name = name
        self._results = results

    def check(self, candidate: Placement, /) -> GateResult:
        return self._results[candidate.name]
