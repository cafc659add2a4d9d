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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
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
    "Columns",
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
#: A quality score as a function of a Model's labels.
_Quality = Callable[[Mapping[str, str]], float]
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
    """One (policy, phase): which Models the require admits, and the static standing."""

    phase: str
    rule: SchedulingRule | None
    tier: ProviderTier
    rejected: frozenset[str]  # Models the require selector turns away (Require FAILs)
    feasible: list[Placement]  # statically feasible, by name
    uncertain: list[Placement]  # statically uncertain, by name
    admitted: list[Placement]  # Ready Models the require admits (candidate lists)
    admitted_names: tuple[str, ...]
    rankings: dict[float | None, Ranking] = field(default_factory=dict)
    columns: Columns | None = None
    _gate: RequireGate | None = None

    @property
    def require_gate(self) -> RequireGate:
        """The rule's Require gate; its two results are built only when a record needs them."""
        if self._gate is None:
            self._gate = RequireGate(self.rule)
        return self._gate

    def require_result(self, name: str) -> GateResult:
        """The Require result of one Model."""
        gate = self.require_gate
        return gate.failed if name in self.rejected else gate.passed

    def first_failure(self, name: str) -> GateResult | None:
        """Require's FAIL, else the provider tier's first FAIL, else None."""
        if name in self.rejected:
            return self.require_gate.failed
        return self.tier.first_fail.get(name)


@dataclass(frozen=True, slots=True)
class Ranked:
    """One statically feasible candidate with its total score."""

    placement: Placement
    score: float
    provider: str
    topology: str | None


@dataclass(frozen=True, slots=True)
class Columns:
    """Agent-independent facts of a table's feasible candidates, one column per fact.

    Columns (not one object per row) keep a ranking to a few list operations: a pass
    ranks every table once per effective bias, and most of that work is done in C.
    """

    placements: tuple[Placement, ...]  # feasible, by name
    ties: tuple[tuple[bool, int, str], ...]
    capacity: tuple[float, ...]  # weighted terms, summed in the engine's order
    locality: tuple[float, ...]
    weight: tuple[float, ...]
    providers: tuple[str, ...]
    topology: tuple[str | None, ...]
    headroom: tuple[int | None, ...]  # agents the provider may still take; None = unknown
    label_sets: tuple[int, ...]  # index of each Model's label set (see Framework)


@dataclass(frozen=True, slots=True)
class Ranking:
    """A rule table's feasible candidates for one effective bias, best first."""

    table: RuleTable
    bias: float | None
    bias_active: bool
    order: tuple[int, ...]  # column indices, best first
    scores: tuple[float, ...]  # total score of ``order[i]``
    quality: Mapping[str, float]  # quality score of every admitted Model, by name

    def __len__(self) -> int:
        return len(self.order)

    def entry(self, position: int) -> Ranked:
        """The candidate at ``position`` (0 is the best)."""
        columns = self.table.columns
        assert columns is not None  # a ranking is built from its table's columns
        index = self.order[position]
        return Ranked(
            columns.placements[index],
            self.scores[position],
            columns.providers[index],
            columns.topology[index],
        )


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
        # Selectors and quality depend on a Model's labels only: index the distinct sets.
        self._label_sets: list[Mapping[str, str]] = []
        self._label_set_of: dict[str, int] = {}
        known: dict[frozenset[tuple[str, str]], int] = {}
        self._models: list[tuple[Placement, str, int, bool]] = []
        for placement in self.placements:
            labels = placement.model.metadata.labels
            index = known.setdefault(frozenset(labels.items()), len(known))
            if index == len(self._label_sets):
                self._label_sets.append(labels)
            self._label_set_of[placement.name] = index
            self._models.append((placement, placement.name, index, placement.model.is_ready))

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
        """Which Models the rule's require admits, and the static standing of the rest.

        The selector is called once per distinct label set: Models that carry the same
        labels get the same answer, and a fleet's models share few label sets. The Require
        gate's result objects are made only when a decision record is read.
        """
        tier = self.tier(max_age_seconds)
        selector = None if rule is None else rule.require
        if selector is None:
            admits = [True] * len(self._label_sets)
        else:
            matcher = selector.matcher
            admits = [matcher(labels) for labels in self._label_sets]
        tier_standing = tier.standing
        rejected: list[str] = []
        admitted_names: list[str] = []
        feasible: list[Placement] = []
        uncertain: list[Placement] = []
        admitted: list[Placement] = []
        for placement, name, label_set, ready in self._models:
            if not admits[label_set]:
                rejected.append(name)
                continue
            if ready:
                admitted.append(placement)
                admitted_names.append(name)
            state = tier_standing[name]
            if state == FEASIBLE:
                feasible.append(placement)
            elif state == UNCERTAIN:
                uncertain.append(placement)
        return RuleTable(
            phase,
            rule,
            tier,
            frozenset(rejected),
            feasible,
            uncertain,
            admitted,
            tuple(admitted_names),
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
        rule = table.rule
        # With a prefer block (or no active bias) the bias changes nothing: share one ranking.
        key = bias if bias_active and not (rule and rule.prefer) else None
        found = table.rankings.get(key)
        if found is not None:
            return found
        columns = table.columns
        if columns is None:
            columns = table.columns = self._columns(table, topology_key)
        score = _quality_function(rule, key)
        by_set = [score(labels) for labels in self._label_sets]
        of = self._label_set_of
        quality = {name: by_set[of[name]] for name in table.admitted_names}
        weight_q = self.weights["Quality"]
        # Summed in the engine's order so that totals tie exactly as in the record.
        negated = [
            -round(by_set[label_set] * weight_q + capacity + locality + weight, 9)
            for label_set, capacity, locality, weight in zip(
                columns.label_sets,
                columns.capacity,
                columns.locality,
                columns.weight,
                strict=True,
            )
        ]
        ranked = sorted(zip(negated, columns.ties, range(len(negated)), strict=True))
        ranking = Ranking(
            table,
            key,
            key is not None,
            tuple(index for _, _, index in ranked),
            tuple(-total for total, _, _ in ranked),
            quality,
        )
        table.rankings[key] = ranking
        return ranking

    def _columns(self, table: RuleTable, topology_key: str | None) -> Columns:
        """Agent-independent score terms and facts of the table's feasible candidates."""
        placements = tuple(table.feasible)
        terms = [self.static_terms(placement, table.phase) for placement in placements]
        providers = tuple(placement.model.spec.provider_ref for placement in placements)
        return Columns(
            placements=placements,
            ties=tuple(tie_break(placement) for placement in placements),
            capacity=tuple(term[0] for term in terms),
            locality=tuple(term[1] for term in terms),
            weight=tuple(term[2] for term in terms),
            providers=providers,
            topology=tuple(
                None if topology_key is None else topology_value(placement, topology_key)
                for placement in placements
            ),
            headroom=tuple(self.headroom.get(provider) for provider in providers),
            label_sets=tuple(self._label_set_of[placement.name] for placement in placements),
        )

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
                gates.append(
                    _Replay(name, {p.name: table.require_result(p.name) for p in self.placements})
                )
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


def _quality_function(rule: SchedulingRule | None, bias: float | None) -> _Quality:
    """The quality score as a function of a Model's labels (see :func:`quality_score`)."""
    if rule is not None and rule.prefer:
        return partial(quality_score, rule=rule, bias=None, bias_active=False)
    if bias is not None:
        return partial(quality_score, rule=rule, bias=bias, bias_active=True)
    return _no_quality


def _no_quality(labels: Mapping[str, str]) -> float:
    return 0.0


class _Replay:
    """A gate whose results were computed earlier in the pass (shared tiers)."""

    def __init__(self, name: str, results: Mapping[str, GateResult]) -> None:
        self.name = name
        self._results = results

    def check(self, candidate: Placement, /) -> GateResult:
        return self._results[candidate.name]
