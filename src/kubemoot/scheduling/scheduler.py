"""One scheduling pass: filter → score → topology spread → bind, for every Agent and phase.

Pure: the cluster comes in as a :class:`ClusterSnapshot`, the time as ``now``; results
come out as values. The operator and ``kubemoot schedule`` both call
:func:`schedule_bundle` (a whole pass) or :class:`SchedulingPass` (agent by agent).
Agents are scheduled in (namespace, name) order so a pass is reproducible; each
binding is *assumed* at once, so the parallelism gate of later agents sees it.
"""

from __future__ import annotations

import gc
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from itertools import chain

from kubemoot.api import (
    CREW_LABEL,
    DEFAULT_MAX_AGE_SECONDS,
    DEFAULT_NAMESPACE,
    Agent,
    Condition,
    CrewSchedulingPolicy,
    KubemootConfig,
    MootArchetype,
    SchedulingRule,
    TopologySpread,
)
from kubemoot.api.loader import Bundle
from kubemoot.gates import DecisionRecord, GateResult, Outcome, Verdict
from kubemoot.scheduling.archetypes import scheduling_order, unknown_phases
from kubemoot.scheduling.bias import BiasTable
from kubemoot.scheduling.bind import (
    CandidateList,
    candidate_list,
    candidates_json,
    declared_sizes,
    with_bound_first,
)
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.framework import PROVIDER_GATES, SCHEDULER_VERSION, Framework
from kubemoot.scheduling.group import AgentRun, BindingGroup, PhasePlan
from kubemoot.scheduling.messages import count_message, defer_text, unschedulable_text
from kubemoot.scheduling.plugins import (
    GATES,
    ParallelismGate,
    SpreadContext,
    TopologySpreadGate,
)
from kubemoot.scheduling.result import (
    AgentResult,
    AgentResults,
    PolicyResult,
    ScheduleResult,
    SchedulingEvent,
)
from kubemoot.scheduling.roster import AgentRoster, Segment
from kubemoot.scheduling.snapshot import ClusterSnapshot, PolicyResolution
from kubemoot.scheduling.tables import ProviderTier, Ranked, Ranking, RuleTable
from kubemoot.scheduling.warnings import snapshot_warnings

__all__ = ["PolicyPlan", "SchedulingPass", "schedule_agent", "schedule_bundle"]

#: Outcome, reason and (for UNSCHEDULABLE) the FailedScheduling message of an unplaced phase.
#: A DEFER reason is written when first read (see :class:`PhasePlan`).
_Unplaced = tuple[Outcome, str | Callable[[], str], str | None]
_ORDER = {name: index for index, name in enumerate(GATES)}


@dataclass(slots=True)
class PolicyPlan:
    """A policy (or no policy) made ready for scheduling: phases, tables, spread, bias."""

    policy: CrewSchedulingPolicy | None
    archetype: MootArchetype
    problems: list[tuple[str, str]]  # (condition reason, message)
    order: list[str]
    tables: dict[str, RuleTable]
    spread: TopologySpread | None
    quality_bias: dict[str, str]
    bias: BiasTable | None = None  # the parsed qualityBias, when there is one

    def __post_init__(self) -> None:
        if self.quality_bias and self.bias is None:
            self.bias = BiasTable(self.quality_bias)

    @property
    def bias_active(self) -> bool:
        return bool(self.quality_bias)

    def effective(self, capabilities: Iterable[str]) -> float | None:
        """An Agent's effective bias under this plan (None without a qualityBias)."""
        return None if self.bias is None else self.bias.effective(capabilities)


@dataclass(slots=True)
class _Governed:
    """What every Agent of one (namespace, crew) shares: its policy, plan and groups."""

    resolution: PolicyResolution
    plan: PolicyPlan
    #: Binding groups by effective bias (see :mod:`kubemoot.scheduling.group`).
    groups: dict[float | None, BindingGroup] = field(default_factory=dict)
    #: Effective bias by capability set; None when the plan has no qualityBias. Shared
    #: by every policy of the pass with the same qualityBias (see :meth:`plan`).
    biases: dict[tuple[str, ...], float | None] | None = None


class SchedulingPass:
    """Schedules Agents one by one against a snapshot, sharing agent-independent work."""

    def __init__(self, snapshot: ClusterSnapshot, *, now: datetime) -> None:
        self.snapshot = snapshot
        self.now = now
        self.framework = Framework(snapshot.placements, now=now, settings=snapshot.settings)
        #: Agents bound to each provider so far in this pass (kube-scheduler's assumed pods).
        self.assumed: dict[str, int] = {}
        #: Bindings assumed so far. Every assumed binding in order (a prefix replays
        #: ``assumed``) is written out from the results' rows when a decision is replayed.
        self._logged = 0
        self._log: list[str] = []
        self._log_rows = 0  # rows whose bindings ``_log`` holds
        self._plans: dict[str | None, PolicyPlan] = {}
        self._resolved: dict[tuple[str, str | None], _Governed] = {}
        self._lists: dict[tuple[object, ...], CandidateList] = {}
        self._ordered: dict[tuple[tuple[object, ...], str | None], CandidateList] = {}
        self._json: dict[int, str] = {}  # candidate list id → its JSON (lists are kept alive)
        self._sizes: dict[tuple[object, ...], dict[str, int]] = {}
        self._events: dict[tuple[str, str], SchedulingEvent] = {}
        self._unschedulable: dict[str, list[str]] = {}
        self._results = AgentResults()
        #: Bumped whenever a provider fills up: answers cached before then may have changed.
        self._saturation = 0
        #: Per ranking (by id; rankings live as long as the pass): the ranks not yet
        #: found full, in rank order.
        self._open: dict[int, list[int]] = {}
        self._unplaced_cache: dict[tuple[int, int, SpreadContext | None], _Unplaced] = {}
        #: Parsed qualityBias tables by content, and each one's effective bias by
        #: capability set (by the table's id; the tables live as long as the pass).
        self._bias_tables: dict[frozenset[tuple[str, str]], BiasTable] = {}
        self._biases: dict[int, dict[tuple[str, ...], float | None]] = {}

    # ------------------------------------------------------------------ policies

    def plan(self, policy: CrewSchedulingPolicy | None) -> PolicyPlan:
        """The policy's archetype, phase order and rule tables, built once per pass."""
        key = None if policy is None else policy.key
        found = self._plans.get(key)
        if found is not None:
            return found
        archetype, problem = self.snapshot.archetype_for(policy)
        problems = [] if problem is None else [("ArchetypeNotFound", problem)]
        spread = None if policy is None else policy.spec.topology_spread
        max_age = DEFAULT_MAX_AGE_SECONDS
        if policy is not None:
            max_age = policy.spec.freshness.max_age_seconds
            for phase in unknown_phases(policy, archetype):
                problems.append(
                    (
                        "UnknownPhase",
                        f'rule phase "{phase}" is not a phase of MootArchetype '
                        f"{archetype.metadata.name} (known: {', '.join(archetype.phase_names)})",
                    )
                )
            if spread is not None:
                for phase in spread.phase_keys:
                    if phase not in archetype.phase_names:
                        problems.append(
                            (
                                "UnknownPhase",
                                f'topologySpread.phaseKeys names "{phase}", not a phase of '
                                f"MootArchetype {archetype.metadata.name}",
                            )
                        )
        order = scheduling_order(archetype, [] if spread is None else spread.phase_keys)
        tables: dict[str, RuleTable] = {}
        for phase in order:
            # A phase without a rule requires nothing: every Ready Model is a candidate.
            rule = None if policy is None else policy.spec.rule_for(phase)
            tables[phase] = self.framework.rule_table(
                phase,
                rule if rule is not None else SchedulingRule(phase=phase),
                max_age_seconds=max_age,
            )
        quality_bias = {} if policy is None else policy.spec.quality_bias
        table: BiasTable | None = None
        if quality_bias:
            # Crews often share one qualityBias: one table, and one answer per capability
            # set, for all of them (a namespace holds up to one class per Agent).
            shared = frozenset(quality_bias.items())
            table = self._bias_tables.get(shared)
            if table is None:
                table = self._bias_tables[shared] = BiasTable(quality_bias)
                self._biases[id(table)] = {}
        found = PolicyPlan(
            policy=policy,
            archetype=archetype,
            problems=problems,
            order=order,
            tables=tables,
            spread=spread,
            quality_bias=quality_bias,
            bias=table,
        )
        self._plans[key] = found
        return found

    # ------------------------------------------------------------------ agents

    def schedule(self, agent: Agent) -> AgentResult:
        """Filter, score, spread and bind every phase of one Agent; assume its bindings."""
        # Straight from metadata: the Agent's properties cost a call each, once per Agent.
        metadata = agent.metadata
        self._assign([(agent, metadata.namespace or DEFAULT_NAMESPACE,
                       metadata.labels.get(CREW_LABEL))])
        return self._results[-1]

    def schedule_all(self, agents: Sequence[Agent] | AgentRoster) -> None:
        """Schedule every Agent, in the pass's (namespace, name) order.

        Agents are read from a roster (:mod:`kubemoot.scheduling.roster`; one is made
        from a sequence): namespace by namespace, the pass walks the Agents' classes and
        counts how many bindings each run of Agents adds, instead of stepping Agent by
        Agent (see :meth:`_assign_segment`). The results are those of :meth:`schedule`
        called for each Agent in that order.
        """
        roster = (
            agents if isinstance(agents, AgentRoster)
            else AgentRoster(agents, capabilities_matter=self.snapshot.capabilities_matter)
        )
        for segment in roster.segments():
            self._assign_segment(segment)

    @property
    def results(self) -> Sequence[AgentResult]:
        """The results of every Agent scheduled so far, in the order they were bound."""
        return self._results

    def _assign(self, agents: Iterable[tuple[Agent, str, str | None]]) -> None:
        """Bind Agents whose namespace and crew label are already read, in the order given.

        The body runs once per Agent, so it only looks things up: the policy of the
        (namespace, crew), the group for the Agent's effective bias, and the count at
        which each provider the group binds fills up. The Agent's result is recorded as
        (Agent, group, bindings assumed before it) and made when first read.
        """
        resolved, assumed = self._resolved, self.assumed
        record = self._results.add
        for agent, namespace, crew in agents:
            governed = resolved.get((namespace, crew))
            if governed is None:
                governed = self._govern(namespace, crew)
            bias = self._bias(governed, tuple(agent.spec.capabilities))
            groups = governed.groups
            group = groups.get(bias)
            if group is None or (group.version != self._saturation and not self._holds(group)):
                group = groups[bias] = self._bind(governed.resolution, governed.plan, bias)
            record((agent, group, self._logged))
            if group.bound:
                self._logged += len(group.bound)
                for provider, full_at in group.limits:
                    count = assumed[provider] = assumed.get(provider, 0) + 1
                    if count == full_at:
                        self._saturation += 1  # it just filled up: cached answers expire
            if group.failed:
                self._failed(governed.plan, group, namespace, agent)

    def _assign_segment(self, segment: Segment) -> None:
        """Bind one namespace's Agents, run by run.

        Agents of one class bind with one group (their policy and bias), and a group's
        decision stands until a provider fills up (:meth:`_holds`). So between two
        *events* (an Agent whose group must be decided, or an Agent after which some
        provider is full) every Agent reuses its group's decision, and what the run
        does to the pass is counts: how many Agents of each group it holds, found by
        bisecting the group's positions. Events are found the same way: provider P
        fills at the n-th Agent, counted from here, of the groups that bind P, where n is
        the headroom P has left. The Agent at an event is bound as :meth:`_assign` binds
        one. Decisions therefore happen at the same Agents, with the same assumed
        counts, as Agent by Agent; the rows of a run are written when first read.
        """
        slots, slot_at, positions = self._slots(segment)
        namespace = segment.namespace
        cursor = [0] * len(slots)  # per slot: how many of its Agents are bound
        assumed, total, at = self.assumed, len(segment), 0
        while at < total:
            groups = [governed.groups.get(bias) for governed, bias in slots]
            stop, next_slot, active = total, -1, []
            for slot, group in enumerate(groups):
                if group is None or (
                    group.version != self._saturation and not self._holds(group)
                ):
                    mine = positions[slot]
                    if cursor[slot] < len(mine) and mine[cursor[slot]] < stop:
                        stop, next_slot = mine[cursor[slot]], slot
                else:
                    active.append(slot)
            if stop == at:  # an event: this Agent's group is decided first
                governed, bias = slots[next_slot]
                group = governed.groups[bias] = self._bind(
                    governed.resolution, governed.plan, bias
                )
                self._step(governed, group, segment, at)
                cursor[next_slot] += 1
                at += 1
                continue
            stop = self._first_fill(groups, active, positions, cursor, stop)
            run_groups = tuple(groups)
            self._results.add_batch(
                AgentRun(segment, at, stop, run_groups, slot_at, self._logged)
            )
            failing = False
            for slot in active:
                count = bisect_left(positions[slot], stop, cursor[slot]) - cursor[slot]
                if not count:
                    continue
                cursor[slot] += count
                group = groups[slot]
                assert group is not None  # active
                failing = failing or bool(group.failed)
                self._logged += count * len(group.bound)
                for provider, full_at in group.limits:
                    filled = assumed[provider] = assumed.get(provider, 0) + count
                    if filled == full_at:
                        self._saturation += 1
            if failing:  # events name each Agent, in pass order
                for position in range(at, stop):
                    slot = 0 if slot_at is None else slot_at[position]
                    group = run_groups[slot]
                    if group is not None and group.failed:
                        governed = slots[slot][0]
                        self._failed(governed.plan, group, namespace, segment.agents[position])
            at = stop

    def _slots(
        self, segment: Segment
    ) -> tuple[list[tuple[_Governed, float | None]], list[int] | None, list[Sequence[int]]]:
        """A namespace's slots (policy resolution and bias), each Agent's slot by
        position (None: one slot holds them all) and each slot's positions, ascending.

        Slots are found per class; whole-list operations (map, a stable sort by slot) do
        the per-Agent part, and only when the namespace holds more than one slot.
        """
        namespace = segment.namespace
        slot_of: dict[tuple[int, float | None], int] = {}
        slots: list[tuple[_Governed, float | None]] = []
        slot_of_class: dict[int, int] = {}
        # Per class, not per Agent; yet a small namespace may hold nearly as many
        # classes as Agents, so the body stays lean: the policy is looked up again only
        # when the crew changes, and a bias only under a qualityBias.
        last: object = slot_of  # no crew label is this
        governed: _Governed | None = None
        classes = segment.classes
        for number in segment.present:
            crew, capabilities = classes[number]
            if crew != last or governed is None:
                last = crew
                governed = self._resolved.get((namespace, crew))
                if governed is None:
                    governed = self._govern(namespace, crew)
            biases = governed.biases
            if biases is None:
                bias = None
            elif capabilities in biases:  # most classes: a capability set seen before
                bias = biases[capabilities]  # type: ignore[index]  # (never None here)
            else:
                # A roster leaves out capabilities only where no qualityBias reads them.
                assert capabilities is not None
                bias = self._bias(governed, capabilities)
            key = (id(governed), bias)
            found = slot_of.get(key)
            if found is None:
                found = slot_of[key] = len(slots)
                slots.append((governed, bias))
            slot_of_class[number] = found
        total = len(segment)
        if len(slots) == 1:
            # Every Agent binds alike (one policy, one bias): the namespace is not even
            # sorted; its rows are written in name order when read.
            return slots, None, [range(total)]
        slot_at = list(map(slot_of_class.__getitem__, segment.class_at))
        # Each slot's positions in ascending order, dealt out in one walk: half the
        # instructions of a stable sort by slot and a count of each slot.
        dealt: list[list[int]] = [[] for _ in slots]
        deal = [positions.append for positions in dealt]
        for position, slot in enumerate(slot_at):
            deal[slot](position)
        return slots, slot_at, list(dealt)

    def _first_fill(
        self,
        groups: list[BindingGroup | None],
        active: list[int],
        positions: list[Sequence[int]],
        cursor: list[int],
        stop: int,
    ) -> int:
        """Where a run from the cursors ends: ``stop``, or just after the first Agent
        whose bindings fill a provider (the n-th Agent binding it, n its headroom left)."""
        holders: dict[str, list[int]] = {}
        left: dict[str, int] = {}
        assumed = self.assumed
        for slot in active:
            group = groups[slot]
            assert group is not None
            for provider, full_at in group.limits:
                if full_at:  # 0: no agent limit
                    holders.setdefault(provider, []).append(slot)
                    left[provider] = full_at - assumed.get(provider, 0)
        for provider, slots in holders.items():
            need = left[provider]  # ≥ 1: an active group binds no full provider
            if len(slots) == 1:
                slot = slots[0]
                index = cursor[slot] + need - 1
                if index >= len(positions[slot]):
                    continue
                position = positions[slot][index]
            else:
                # Only the Agents before ``stop`` can bring it forward: when fewer than
                # ``need`` of them bind the provider, it does not fill before ``stop``
                # and nothing needs merging.
                ends = [
                    bisect_left(
                        positions[slot], stop, cursor[slot],
                        min(cursor[slot] + need, len(positions[slot])),
                    )
                    for slot in slots
                ]
                if sum(ends) - sum(cursor[slot] for slot in slots) < need:
                    continue
                nearest = sorted(
                    chain.from_iterable(
                        positions[slot][cursor[slot] : end]
                        for slot, end in zip(slots, ends, strict=True)
                    )
                )
                position = nearest[need - 1]
            if position < stop:
                stop = position + 1
        return stop

    def _step(
        self,
        governed: _Governed,
        group: BindingGroup,
        segment: Segment,
        at: int,
    ) -> None:
        """Bind the Agent at ``at`` of a segment with ``group``: :meth:`_assign`'s body."""
        self._results.add_batch(
            AgentRun(segment, at, at + 1, (group,), None, self._logged)
        )
        if group.bound:
            self._logged += len(group.bound)
            assumed = self.assumed
            for provider, full_at in group.limits:
                count = assumed[provider] = assumed.get(provider, 0) + 1
                if count == full_at:
                    self._saturation += 1
        if group.failed:
            self._failed(governed.plan, group, segment.namespace, segment.agents[at])

    def _bias(self, governed: _Governed, capabilities: tuple[str, ...]) -> float | None:
        """An Agent's effective bias under its policy; each capability set parsed once."""
        biases = governed.biases
        if biases is None:
            return None
        if capabilities in biases:
            return biases[capabilities]
        found = biases[capabilities] = governed.plan.effective(capabilities)
        return found

    def _failed(
        self, plan: PolicyPlan, group: BindingGroup, namespace: str, agent: Agent
    ) -> None:
        agent_id = f"{namespace}/{agent.metadata.name}"
        for failed in group.failed:
            self._event(plan, failed, agent_id)

    def _govern(self, namespace: str, crew: str | None) -> _Governed:
        """The policy an Agent's (namespace, crew) resolves to, with its plan; once each."""
        resolution = self.snapshot.resolve(namespace, crew)
        plan = self.plan(resolution.policy)
        biases = None if plan.bias is None else self._biases[id(plan.bias)]
        found = self._resolved[(namespace, crew)] = _Governed(resolution, plan, biases=biases)
        return found

    def _holds(self, group: BindingGroup) -> bool:
        """Whether a group decided before some provider filled up still decides the same.

        Assumed bindings only grow: a candidate the walk skipped as full is still full,
        so the walk ends where it did unless a provider the group binds is now full. An
        unplaced phase is decided again, since its reason names which providers are full.
        """
        if group.unplaced:
            return False
        assumed, headroom = self.assumed, self.framework.headroom
        for provider in group.bound:
            limit = headroom.get(provider)
            if limit is not None and assumed.get(provider, 0) > limit:
                return False
        group.version = self._saturation
        return True

    def _bind(
        self, resolution: PolicyResolution, plan: PolicyPlan, bias: float | None
    ) -> BindingGroup:
        """Decide every phase for the Agents of one policy and bias, as of now."""
        spread = plan.spread
        spread_phases = set() if spread is None else set(spread.phase_keys)
        topology_key = None if spread is None else spread.topology_key
        used: set[str] = set()
        phases: list[PhasePlan] = []
        for phase in plan.order:
            ranking = self.framework.ranking(
                plan.tables[phase],
                bias=bias,
                bias_active=plan.bias_active,
                topology_key=topology_key,
            )
            avoid = frozenset(used) if phase in spread_phases and used else frozenset()
            chosen, alternatives = self._choose(ranking, avoid, spread)
            context = (
                None
                if spread is None or not avoid
                else SpreadContext(
                    spread.topology_key, spread.when_unsatisfiable, avoid, alternatives
                )
            )
            if chosen is None:
                outcome, reason, message = self._unplaced(ranking.table, context)
                phases.append(PhasePlan(phase, ranking, outcome, None, reason, context, message))
                continue
            # Written when first read, like a DEFER reason: most groups are decided
            # again before anyone reads them, and the score's formatting is dear.
            placed = _Once(partial(_placed_reason, chosen, context))
            phases.append(PhasePlan(phase, ranking, Outcome.PLACE, chosen, placed, context))
            if phase in spread_phases and chosen.topology is not None:
                used.add(chosen.topology)
        group = BindingGroup(
            self, resolution.policy, resolution.note, tuple(phases), self._saturation,
            resolution.reason,
        )
        # The count at which each bound provider fills up (0: it has no agent limit).
        headroom = self.framework.headroom
        group.limits = tuple(
            (provider, headroom[provider] + 1 if provider in headroom else 0)
            for provider in group.bound
        )
        return group

    def _choose(
        self, ranking: Ranking, avoid: frozenset[str], spread: TopologySpread | None
    ) -> tuple[Ranked | None, bool]:
        """The best candidate the per-Agent gates admit, and whether spread had a choice."""
        index = ranking.table.index
        order, providers, headroom, topology = (
            ranking.order,
            index.providers,
            index.headroom,
            ranking.topology,
        )
        seen = self.assumed
        # Assumed bindings only grow during a pass, so a provider that is full stays full:
        # a rank found full is dropped from the ranking's open ranks for every later walk.
        ranks = self._open.get(id(ranking))
        if ranks is None:
            ranks = self._open[id(ranking)] = list(range(len(order)))
        fallback: int | None = None
        kept: list[int] = []  # the ranks walked that are not full
        chosen: int | None = None
        for rank in ranks:
            position = order[rank]
            limit = headroom[position]
            if limit is not None and seen.get(providers[position], 0) > limit:
                continue  # the Parallelism gate FAILs once earlier bindings fill it
            kept.append(rank)
            value = topology[position]
            if avoid and value is not None and value in avoid:
                if fallback is None:
                    fallback = rank
                continue
            chosen = rank
            break
        walked = len(ranks) if chosen is None else ranks.index(chosen, len(kept) - 1) + 1
        if walked != len(kept):
            ranks[:walked] = kept
        if chosen is not None:
            return ranking.entry(chosen), True
        if (
            fallback is not None
            and spread is not None
            and spread.when_unsatisfiable == "ScheduleAnyway"
        ):
            return ranking.entry(fallback), False
        return None, False

    # ------------------------------------------------------------------ read on demand

    def decision(
        self, ranking: Ranking, subject: str, position: int, spread: SpreadContext | None
    ) -> DecisionRecord:
        """The full decision record of a phase, replayed with the bindings assumed before
        the Agent (the first ``position`` entries of the pass's binding log)."""
        log = self._log
        rows = self._results.rows
        for _, group, _ in rows[self._log_rows :]:
            log.extend(group.bound)
        self._log_rows = len(rows)
        seen = dict(Counter(log[:position]))
        return self.framework.decide(ranking, subject=subject, assumed=seen, spread=spread)

    def candidates(self, ranking: Ranking, bound: str | None) -> CandidateList:
        """The phase's candidate list with ``bound`` first; lists are shared."""
        # Rankings with one signature admit the same Models with the same quality scores.
        key = (ranking.signature, bound)
        found = self._ordered.get(key)
        if found is None:
            base = self._lists.get(ranking.signature)
            if base is None:
                base = candidate_list(ranking.table.admitted, ranking.quality)
                self._lists[ranking.signature] = base
            found = self._ordered[key] = with_bound_first(base, bound)
        return found

    def candidates_json(self, candidates: CandidateList) -> str:
        """A shared candidate list as its env var's JSON, rendered once."""
        found = self._json.get(id(candidates))
        if found is None:
            found = self._json[id(candidates)] = candidates_json(candidates)
        return found

    def declared_sizes(self, ranking: Ranking) -> Mapping[str, int]:
        """The declared vramMib of the identifiers a phase's candidate list names."""
        found = self._sizes.get(ranking.signature)
        if found is None:
            found = self._sizes[ranking.signature] = declared_sizes(ranking.table.admitted)
        return found

    def _unplaced(self, table: RuleTable, context: SpreadContext | None) -> _Unplaced:
        """DEFER or UNSCHEDULABLE and its reason, from the shared tiers.

        Agents with the same table and spread state see the same answer until a provider
        fills up, so the answer is cached per saturation version. The fuzz tests check it
        against the full decision record.
        """
        key = (id(table), self._saturation, context)
        found = self._unplaced_cache.get(key)
        if found is None:
            found = self._explain_unplaced(table, context)
            self._unplaced_cache[key] = found
        return found

    def _explain_unplaced(self, table: RuleTable, context: SpreadContext | None) -> _Unplaced:
        tier, index = table.tier, table.index
        seen = dict(self.assumed)  # as of now: a DEFER reason is written when first read
        seen_get, limits, providers = seen.get, tier.limits, index.providers
        placements = index.placements
        spread_gate = TopologySpreadGate(context)
        # Verdicts only: results with their words are made for a record or a message.
        spread_judge = None if context is None or not context.used else spread_gate.judge

        def full(position: int) -> bool:
            limit = limits[position]
            return limit is not None and seen_get(providers[position], 0) > limit

        waiting = [
            position
            for position in table.uncertain_positions
            if ((limit := limits[position]) is None or seen_get(providers[position], 0) <= limit)
            and (spread_judge is None or spread_judge(placements[position]) is not Verdict.FAIL)
        ]
        if waiting:
            # The outcome is all the pass needs; the words cost a gate check per waiting
            # candidate, and most groups are decided again before anyone reads them.
            waits = [placements[position] for position in waiting]
            return Outcome.DEFER, _Once(partial(self._defer_reason, tier, waits, seen)), None
        parallelism = self._parallelism(tier, seen)
        firsts: list[GateResult] = []
        for position, placement in enumerate(placements):
            first = table.first_failure(placement.name)
            if (first is None or _ORDER[first.gate] > _ORDER["Parallelism"]) and full(position):
                first = parallelism.check(placement)
            if first is None:
                spread_result = spread_gate.check(placement)
                if spread_result.result is Verdict.FAIL:
                    first = spread_result
            if first is not None:
                firsts.append(first)
        total = len(self.framework.placements)
        return (
            Outcome.UNSCHEDULABLE,
            unschedulable_text(table.phase, total, firsts, table.rule),
            count_message(table.phase, total, firsts),
        )

    def _parallelism(self, tier: ProviderTier, seen: dict[str, int]) -> ParallelismGate:
        return ParallelismGate.from_args(
            self.framework.args(max_age_seconds=tier.max_age_seconds, assumed=seen)
        )

    def _defer_reason(
        self, tier: ProviderTier, waiting: list[Placement], seen: dict[str, int]
    ) -> str:
        """What each waiting candidate waits on, with the bindings assumed back then."""
        parallelism = self._parallelism(tier, seen)
        waits: list[tuple[str, list[GateResult]]] = []
        for placement in waiting:
            results = list(tier.results(placement.name))
            results.insert(PROVIDER_GATES.index("VRAM") + 1, parallelism.check(placement))
            waits.append((placement.name, [r for r in results if r.waits]))
        return defer_text(waits)

    # ------------------------------------------------------------------ status

    def condition(self, kind: str, status: str, reason: str, message: str) -> Condition:
        """A condition stamped with the pass's ``now``."""
        return Condition.model_validate(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": self.now,
            }
        )

    def _event(self, plan: PolicyPlan, result: PhasePlan, agent_id: str) -> None:
        policy = plan.policy
        if policy is None:
            regarding = f"Agent/{agent_id}"  # no policy to carry it: the Agent does
        else:
            regarding = f"CrewSchedulingPolicy/{policy.namespace}/{policy.metadata.name}"
            self._unschedulable.setdefault(policy.key, []).append(
                f"{agent_id} phase {result.phase}"
            )
        message = result.failure_message
        assert message is not None  # every UNSCHEDULABLE phase carries its message
        key = (regarding, message)
        event = self._events.get(key)
        if event is None:
            event = SchedulingEvent("Warning", "FailedScheduling", regarding, message)
            self._events[key] = event
        else:
            event.count += 1
        event.agents.append(agent_id)

    def result(self) -> ScheduleResult:
        """Everything the pass decided, with the conditions of every policy."""
        policies: list[PolicyResult] = []
        for policy in sorted(self.snapshot.policies, key=lambda p: p.key):
            plan = self.plan(policy)
            if plan.problems:
                valid = self.condition(
                    "Valid",
                    "False",
                    plan.problems[0][0],
                    "; ".join(message for _, message in plan.problems),
                )
            else:
                valid = self.condition(
                    "Valid",
                    "True",
                    "Valid",
                    f"phases match MootArchetype {plan.archetype.metadata.name}",
                )
            failures = self._unschedulable.get(policy.key, [])
            if failures:
                shown = ", ".join(failures[:5]) + (
                    f" and {len(failures) - 5} more" if len(failures) > 5 else ""
                )
                scheduled = self.condition(
                    "Scheduled", "False", "AgentsUnschedulable", f"unschedulable: {shown}"
                )
            else:
                scheduled = self.condition(
                    "Scheduled",
                    "True",
                    "NoUnschedulableAgents",
                    "every governed Agent phase is bound or waits on evidence",
                )
            policies.append(PolicyResult(policy, [valid, scheduled]))
        return ScheduleResult(
            now=self.now,
            scheduler_version=SCHEDULER_VERSION,
            agents=self._results.copy(),
            events=list(self._events.values()),
            policies=policies,
            warnings=snapshot_warnings(self.snapshot.models, self.snapshot.providers),
        )


def _placed_reason(chosen: Ranked, context: SpreadContext | None) -> str:
    """Why a phase binds ``chosen``: its Model, provider and score, and whether the
    topology spread had to be let go."""
    reason = f"{chosen.placement.name} on {chosen.provider} scored {chosen.score:g}"
    if context is not None and not context.alternatives:
        reason += (
            f"; topology spread unsatisfiable ({context.topology_key} already used), "
            "ScheduleAnyway"
        )
    return reason


class _Once:
    """A function of no arguments whose answer is worked out on first call and kept.

    What ``functools.cache`` does for such a function, without its wrapper's set-up
    (copying the wrapped function's name and docs), which a pass pays per unplaced group.
    """

    __slots__ = ("_answer", "_work")

    def __init__(self, work: Callable[[], str]) -> None:
        self._work: Callable[[], str] | None = work
        self._answer = ""

    def __call__(self) -> str:
        if self._work is not None:
            self._answer, self._work = self._work(), None
        return self._answer


def schedule_bundle(
    bundle: Bundle | ClusterSnapshot,
    *,
    now: datetime,
    config: KubemootConfig | None = None,
) -> ScheduleResult:
    """Schedule every Agent of a bundle (or snapshot) at ``now``."""
    with collector_paused():
        snapshot = (
            bundle
            if isinstance(bundle, ClusterSnapshot)
            else ClusterSnapshot.from_bundle(bundle, config=config)
        )
        scheduling = SchedulingPass(snapshot, now=now)
        scheduling.schedule_all(snapshot.roster)
        return scheduling.result()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector stays off for the length of one pass.

    A pass allocates a few small objects per Agent and keeps them until its result is
    dropped, so a collection in the middle of it frees nothing; yet every allocation
    counts toward the next one, and the oldest generation's collections walk every live
    object, the whole parsed cluster included. At 50,000 Agents one such collection
    costs more than the pass. The collector resumes, with its counts, after the pass.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def schedule_agent(agent: Agent, snapshot: ClusterSnapshot, now: datetime) -> AgentResult:
    """Schedule one Agent alone (the operator's reconcile of a single Agent)."""
    return SchedulingPass(snapshot, now=now).schedule(agent)
