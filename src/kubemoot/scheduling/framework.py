"""The scheduling framework: gates in order, scores over feasible candidates, weights.

Plugins are small and know nothing of each other (:mod:`kubemoot.scheduling.plugins`);
this module applies the rules. The decision itself is the gates engine's
(:func:`kubemoot.gates.evaluate`): hard gates first, scores only for feasible
candidates, bounded scores checked, weights applied, PLACE / DEFER / UNSCHEDULABLE.

Most of a decision does not depend on the Agent, so the framework computes it once and
shares it (kube-scheduler caches node info the same way):

* *provider tier* — every gate whose verdict depends only on the Model and its provider
  (readiness, freshness, VRAM, license, egress, digest, parallelism with nothing
  assumed), once per pass and freshness limit. Only the verdicts are worked out then
  (each gate's ``judge``); a Model's results with their reasons and evidence are made
  when a decision record or an unplaced phase's message first reads them, since most
  are never read;
* *rule tier* — the Require gate, once per (policy, phase) and distinct label set;
* *ranking* — quality + capacity + locality + provider weight of each statically
  feasible candidate, once per (policy, phase, effective bias), and computed only once
  for tables that rank alike (:mod:`kubemoot.scheduling.tables` holds them as columns).

Only the parallelism gate (agents bound earlier in the pass) and topology spread (the
Agent's earlier phases) are per Agent; the scheduler applies them while walking the
ranking, once per group of alike Agents (:mod:`kubemoot.scheduling.group`).
:meth:`Framework.decide` replays the whole decision through the engine with those
per-Agent gates, and the tests check that it agrees with the fast path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any

from kubemoot import __version__
from kubemoot.api import SchedulerSettings, SchedulingRule
from kubemoot.gates import (
    DecisionRecord,
    Gate,
    GateResult,
    Standing,
    Verdict,
    Weighted,
    evaluate,
    verdict_standing,
)
from kubemoot.scheduling.candidate import Placement, stale_age
from kubemoot.scheduling.plugins import (
    GATES,
    JUDGED,
    SCORERS,
    ParallelismGate,
    PluginArgs,
    RequireGate,
    SpreadContext,
    TopologySpreadGate,
    agent_limit,
)
from kubemoot.scheduling.tables import (
    ModelIndex,
    ProviderTier,
    QualityFunction,
    Ranked,
    Ranking,
    RuleTable,
    quality_function,
    quality_signature,
    tie_break,
)

__all__ = [
    "AGENT_GATES",
    "PROVIDER_GATES",
    "SCHEDULER_VERSION",
    "SCORING_POLICY_VERSION",
    "Framework",
    "ProviderTier",
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

_FAIL, _HARD_FAILED = Verdict.FAIL, Standing.HARD_FAILED
#: A table's (feasible in tie-break order, uncertain, admitted) Model positions.
_Selection = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
#: A ranking's (positions best first, their totals, quality per label set).
_Ranked = tuple[tuple[int, ...], tuple[float, ...], list[float]]


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
        self.index = ModelIndex(self.placements, self.headroom)
        self._selections: dict[tuple[int, tuple[bool, ...]], _Selection] = {}
        self._ranked: dict[tuple[object, ...], _Ranked] = {}
        #: Each total a ranking summed, negated and rounded as the record rounds it. The
        #: rankings of a pass sum a few hundred distinct totals some ten thousand times
        #: (the same candidate terms under a handful of quality scores), and ``round``
        #: to 9 digits goes through a decimal conversion each time.
        self._negated: dict[float, float] = {}

    # ------------------------------------------------------------------ shared tiers

    def args(self, **context: Any) -> PluginArgs:
        """Plugin context for this pass, plus ``context``."""
        return PluginArgs(now=self.now, settings=self.settings, **context)

    def tier(self, max_age_seconds: int) -> ProviderTier:
        """Provider-tier results for a freshness limit, computed once."""
        found = self._tiers.get(max_age_seconds)
        if found is not None:
            return found
        args = self.args(max_age_seconds=max_age_seconds)
        gates = tuple(JUDGED[name](args) for name in PROVIDER_GATES)
        # Parallelism with nothing assumed yet: an unknown limit or a provider already full
        # by its own report is agent-independent; later bindings can only add FAILs. It
        # counts for the standing, but is not one of the tier's results.
        judges = [gate.judge for gate in gates]
        judges.append(ParallelismGate.from_args(args).judge)
        # Verdicts only: the standing rule needs no more, and the results with their
        # reasons and evidence (a few microseconds a gate) are made when read.
        tier_size = len(gates)
        standings: dict[str, Standing] = {}
        first_failing: dict[str, int] = {}
        for placement in self.placements:
            verdicts = [judge(placement) for judge in judges]
            # No judged gate admits an UNKNOWN (JudgedGate): the verdicts decide.
            where = standings[placement.name] = verdict_standing(verdicts)
            if where is _HARD_FAILED:
                first = verdicts.index(_FAIL)
                if first < tier_size:
                    first_failing[placement.name] = first
        index = self.index
        limits = [
            None if limit is None or stale_age(placement.provider, self.now, max_age_seconds)
            is not None else limit
            for placement, limit in zip(self.placements, index.headroom, strict=True)
        ]
        feasible_by_set: list[list[int]] = [[] for _ in index.label_sets]
        uncertain_by_set: list[list[int]] = [[] for _ in index.label_sets]
        for position, name in enumerate(index.names):
            state = standings[name]
            if state is Standing.FEASIBLE:
                feasible_by_set[index.set_of[position]].append(position)
            elif state is Standing.UNCERTAIN:
                uncertain_by_set[index.set_of[position]].append(position)
        tier = ProviderTier(
            max_age_seconds,
            gates,
            {placement.name: placement for placement in self.placements},
            standings,
            limits,
            first_failing,
            feasible_by_set,
            uncertain_by_set,
        )
        self._tiers[max_age_seconds] = tier
        return tier

    def rule_table(
        self, phase: str, rule: SchedulingRule | None, *, max_age_seconds: int
    ) -> RuleTable:
        """Which Models the rule's require admits, and the static standing of the rest.

        The selector runs once per distinct label set: Models with the same labels get
        the same answer. The Require gate's result objects are made only when a decision
        record is read.
        """
        tier = self.tier(max_age_seconds)
        index = self.index
        selector = None if rule is None else rule.require
        if selector is None:
            admits = (True,) * len(index.label_sets)
        else:
            matcher = selector.matcher
            admits = tuple([matcher(labels) for labels in index.label_sets])
        selected = self._selections.get((max_age_seconds, admits))
        if selected is None:
            # Policies often repeat a selector (one template per crew): select once.
            sets = [label_set for label_set, admitted in enumerate(admits) if admitted]
            selected = (
                index.by_tie_break(index.select(tier.feasible_by_set, sets)),
                tuple(index.select(tier.uncertain_by_set, sets)),
                tuple(index.select(index.ready_by_set, sets)),
            )
            self._selections[(max_age_seconds, admits)] = selected
        feasible, uncertain, admitted = selected
        return RuleTable(phase, rule, tier, index, admits, feasible, uncertain, admitted)

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
        # Tables of different policies often rank the same way (same phase, same admitted
        # Models, same quality terms): the order is computed once for all of them.
        signature = (
            table.phase,
            table.tier.max_age_seconds,
            table.admits,
            quality_signature(rule, key),
        )
        ranked = self._ranked.get(signature)
        if ranked is None:
            ranked = self._rank(table, quality_function(rule, key))
            self._ranked[signature] = ranked
        order, scores, by_set = ranked
        ranking = Ranking(
            table,
            key,
            key is not None,
            order,
            scores,
            by_set,
            self.index.topology(topology_key),
            signature,
        )
        table.rankings[key] = ranking
        return ranking

    def _rank(self, table: RuleTable, score: QualityFunction) -> _Ranked:
        """Feasible positions best first, their totals, and the quality of each label set."""
        index = self.index
        by_set = [
            score(labels) if admitted else 0.0
            for labels, admitted in zip(index.label_sets, table.admits, strict=True)
        ]
        positions = table.feasible_positions
        capacity, locality, weight = index.terms(
            table.phase, positions, strategy=self.settings.strategy, weights=self.weights
        )
        weight_q, set_of = self.weights["Quality"], index.set_of
        # Summed in the engine's order so that totals tie exactly as in the record.
        totals = [
            by_set[set_of[i]] * weight_q + capacity[i] + locality[i] + weight[i]
            for i in positions
        ]
        known = self._negated
        seen = set(totals)
        if 0.0 in seen:
            # 0.0 and -0.0 are one key, yet round apart (by sign): no memo for them.
            negated = [-round(total, 9) for total in totals]
        else:
            for total in seen.difference(known):
                known[total] = -round(total, 9)
            negated = list(map(known.__getitem__, totals))
        # ``positions`` is in tie-break order, and the sort is stable: equal totals keep it.
        ranks = sorted(range(len(positions)), key=negated.__getitem__)
        return (
            tuple([positions[rank] for rank in ranks]),
            tuple([-negated[rank] for rank in ranks]),
            by_set,
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
                gates.append(
                    _Replay(name, {p.name: tier.results(p.name)[index] for p in self.placements})
                )
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
