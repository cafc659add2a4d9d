"""One scheduling pass: filter → score → topology spread → bind, for every Agent and phase.

Pure: the cluster comes in as a :class:`ClusterSnapshot`, the time as ``now``; results
come out as values. The operator and ``kubemoot schedule`` both call
:func:`schedule_bundle` (a whole pass) or :class:`SchedulingPass` (agent by agent).
Agents are scheduled in (namespace, name) order so a pass is reproducible; each
binding is *assumed* at once, so the parallelism gate of later agents sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from kubemoot.api import (
    DEFAULT_MAX_AGE_SECONDS,
    Agent,
    Condition,
    CrewSchedulingPolicy,
    KubemootConfig,
    LastUnschedulable,
    MootArchetype,
    SchedulingRule,
    TopologySpread,
)
from kubemoot.api.loader import Bundle
from kubemoot.gates import DecisionRecord, GateResult, Outcome, Verdict
from kubemoot.scheduling.archetypes import scheduling_order, unknown_phases
from kubemoot.scheduling.bias import effective_bias
from kubemoot.scheduling.bind import (
    ENV_CANDIDATES,
    ENV_MODEL,
    ENV_MODEL_ENDPOINT,
    ENV_TRIAGE_ENDPOINT,
    ENV_TRIAGE_MODEL_ID,
    CandidateList,
    candidate_list,
    candidates_json,
    with_bound_first,
)
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.framework import (
    PROVIDER_GATES,
    SCHEDULER_VERSION,
    Framework,
    Ranked,
    Ranking,
    RuleTable,
)
from kubemoot.scheduling.messages import (
    count_message,
    defer_text,
    failed_scheduling_message,
    unschedulable_text,
)
from kubemoot.scheduling.plugins import (
    GATES,
    ParallelismGate,
    SpreadContext,
    TopologySpreadGate,
)
from kubemoot.scheduling.result import (
    AgentResult,
    PhaseResult,
    PolicyResult,
    ScheduleResult,
    SchedulingEvent,
)
from kubemoot.scheduling.snapshot import ClusterSnapshot

__all__ = ["PolicyPlan", "SchedulingPass", "schedule_agent", "schedule_bundle"]

_UNRESOLVED = (Verdict.UNKNOWN, Verdict.STALE)
#: Outcome, reason and (for UNSCHEDULABLE) the FailedScheduling message of an unplaced phase.
_Unplaced = tuple[Outcome, str, str | None]
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

    @property
    def bias_active(self) -> bool:
        return bool(self.quality_bias)


class SchedulingPass:
    """Schedules Agents one by one against a snapshot, sharing agent-independent work."""

    def __init__(self, snapshot: ClusterSnapshot, *, now: datetime) -> None:
        self.snapshot = snapshot
        self.now = now
        self.framework = Framework(snapshot.placements, now=now, settings=snapshot.settings)
        self.assumed: dict[str, int] = {}
        self._plans: dict[str | None, PolicyPlan] = {}
        self._lists: dict[int, CandidateList] = {}
        self._json: dict[int, str] = {}  # candidate list id → its JSON (lists are kept alive)
        self._events: dict[tuple[str, str], SchedulingEvent] = {}
        self._unschedulable: dict[str, list[str]] = {}
        self._agents: list[AgentResult] = []
        self._saturation = 0
        self._cursor: dict[int, int] = {}
        self._ordered: dict[tuple[int, str | None], tuple[CandidateList, str]] = {}
        self._unplaced_cache: dict[tuple[int, int, SpreadContext | None], _Unplaced] = {}

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
        found = PolicyPlan(
            policy=policy,
            archetype=archetype,
            problems=problems,
            order=order,
            tables=tables,
            spread=spread,
            quality_bias={} if policy is None else policy.spec.quality_bias,
        )
        self._plans[key] = found
        return found

    # ------------------------------------------------------------------ agents

    def schedule(self, agent: Agent) -> AgentResult:
        """Filter, score, spread and bind every phase of one Agent; assume its bindings."""
        resolution = self.snapshot.resolve_policy(agent)
        plan = self.plan(resolution.policy)
        bias = (
            effective_bias(plan.quality_bias, agent.spec.capabilities) if plan.bias_active else None
        )
        seen = dict(self.assumed)  # what this Agent's parallelism gate sees, kept for replay
        spread = plan.spread
        spread_phases = set() if spread is None else set(spread.phase_keys)
        topology_key = None if spread is None else spread.topology_key
        used: set[str] = set()
        bound: set[str] = set()
        subject_base = f"Agent/{agent.namespace}/{agent.metadata.name}"
        phases: dict[str, PhaseResult] = {}
        for phase in plan.order:
            table = plan.tables[phase]
            ranking = self.framework.ranking(
                table, bias=bias, bias_active=plan.bias_active, topology_key=topology_key
            )
            avoid = frozenset(used) if phase in spread_phases and used else frozenset()
            chosen, alternatives = self._choose(ranking, seen, avoid, spread)
            context = (
                None
                if spread is None or not avoid
                else SpreadContext(
                    spread.topology_key, spread.when_unsatisfiable, avoid, alternatives
                )
            )
            decide = self._decider(ranking, f"{subject_base} phase {phase}", seen, context)
            result = self._phase_result(phase, ranking, chosen, decide, context)
            phases[phase] = result
            if chosen is not None:
                bound.add(chosen.provider)
                if phase in spread_phases and chosen.topology is not None:
                    used.add(chosen.topology)
        headroom = self.framework.headroom
        for provider in bound:
            count = self.assumed.get(provider, 0) + 1
            self.assumed[provider] = count
            limit = headroom.get(provider)
            if limit is not None and count == limit + 1:
                self._saturation += 1  # the provider just filled up: cached answers expire
        outcome = self._agent_result(agent, plan, phases, resolution.note)
        self._agents.append(outcome)
        return outcome

    def _choose(
        self,
        ranking: Ranking,
        seen: dict[str, int],
        avoid: frozenset[str],
        spread: TopologySpread | None,
    ) -> tuple[Ranked | None, bool]:
        """The best candidate the per-Agent gates admit, and whether spread had a choice."""
        facts = ranking.table.tier.facts
        entries = ranking.entries
        # Assumed bindings only grow during a pass, so a provider that is full stays full:
        # the ranking's full head is skipped once for every later Agent.
        start = self._cursor.get(id(ranking), 0)
        while start < len(entries):
            head = entries[start]
            headroom = facts[head.provider].headroom
            if headroom is None or seen.get(head.provider, 0) <= headroom:
                break
            start += 1
        self._cursor[id(ranking)] = start
        fallback: Ranked | None = None
        for index in range(start, len(entries)):
            entry = entries[index]
            headroom = facts[entry.provider].headroom
            if headroom is not None and seen.get(entry.provider, 0) > headroom:
                continue  # the Parallelism gate FAILs once earlier bindings fill it
            if avoid and entry.topology is not None and entry.topology in avoid:
                if fallback is None:
                    fallback = entry
                continue
            return entry, True
        if (
            fallback is not None
            and spread is not None
            and spread.when_unsatisfiable == "ScheduleAnyway"
        ):
            return fallback, False
        return None, False

    def _decider(
        self,
        ranking: Ranking,
        subject: str,
        seen: dict[str, int],
        context: SpreadContext | None,
    ) -> Callable[[], DecisionRecord]:
        framework = self.framework

        def decide() -> DecisionRecord:
            return framework.decide(ranking, subject=subject, assumed=seen, spread=context)

        return decide

    def _candidates(self, ranking: Ranking, bound: str | None) -> CandidateList:
        """The phase's candidate list with ``bound`` first; lists and their JSON are shared."""
        key = (id(ranking), bound)
        found = self._ordered.get(key)
        if found is None:
            base = self._lists.get(id(ranking))
            if base is None:
                base = candidate_list(ranking.table.admitted, ranking.quality)
                self._lists[id(ranking)] = base
            ordered = with_bound_first(base, bound)
            found = (ordered, candidates_json(ordered))
            self._ordered[key] = found
            self._json[id(ordered)] = found[1]
        return found[0]

    def _phase_result(
        self,
        phase: str,
        ranking: Ranking,
        chosen: Ranked | None,
        decide: Callable[[], DecisionRecord],
        context: SpreadContext | None,
    ) -> PhaseResult:
        if chosen is not None:
            placement = chosen.placement
            reason = f"{placement.name} on {chosen.provider} scored {chosen.score:g}"
            if context is not None and not context.alternatives:
                reason += (
                    f"; topology spread unsatisfiable ({context.topology_key} already used), "
                    "ScheduleAnyway"
                )
            return PhaseResult(
                phase,
                Outcome.PLACE,
                placement,
                chosen.score,
                self._candidates(ranking, placement.model_id),
                reason,
                decide,
            )
        outcome, reason, message = self._unplaced(ranking.table, context)
        candidates = self._candidates(ranking, None)
        return PhaseResult(
            phase, outcome, None, None, candidates, reason, decide, failure_message=message
        )

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
        tier = table.tier
        facts = tier.facts
        seen = self.assumed
        parallelism = ParallelismGate.from_args(
            self.framework.args(max_age_seconds=tier.max_age_seconds, assumed=dict(seen))
        )
        spread_gate = TopologySpreadGate(context)

        def full(placement: Placement) -> bool:
            fact = facts.get(placement.model.spec.provider_ref)
            if fact is None or fact.headroom is None or fact.stale:
                return False
            return seen.get(placement.model.spec.provider_ref, 0) > fact.headroom

        waits: list[tuple[str, list[GateResult]]] = []
        for placement in table.uncertain:
            if full(placement) or spread_gate.check(placement).result is Verdict.FAIL:
                continue
            results = list(tier.results[placement.name])
            results.insert(PROVIDER_GATES.index("VRAM") + 1, parallelism.check(placement))
            waits.append((placement.name, [r for r in results if r.result in _UNRESOLVED]))
        if waits:
            return Outcome.DEFER, defer_text(waits), None
        firsts: list[GateResult] = []
        for placement in self.framework.placements:
            first = table.first_fail.get(placement.name)
            if (first is None or _ORDER[first.gate] > _ORDER["Parallelism"]) and full(placement):
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

    # ------------------------------------------------------------------ status

    def _agent_result(
        self,
        agent: Agent,
        plan: PolicyPlan,
        phases: dict[str, PhaseResult],
        note: str | None,
    ) -> AgentResult:
        env: dict[str, str] = {}
        mulling, triage = phases.get("mulling"), phases.get("triage")
        if mulling is not None and mulling.placement is not None:
            env[ENV_MODEL] = mulling.placement.model_id
            env[ENV_MODEL_ENDPOINT] = mulling.endpoint or ""
        if triage is not None and triage.placement is not None:
            env[ENV_TRIAGE_MODEL_ID] = triage.placement.model_id
            env[ENV_TRIAGE_ENDPOINT] = triage.endpoint or ""
        for phase, variable in ENV_CANDIDATES.items():
            if phase in phases:
                env[variable] = self._json[id(phases[phase].candidates)]

        policy = plan.policy
        policy_name = None if policy is None else policy.metadata.name
        last = (
            None
            if agent.status is None or agent.status.scheduling is None
            else (agent.status.scheduling.last_unschedulable)
        )
        failed = [r for r in phases.values() if r.outcome is Outcome.UNSCHEDULABLE]
        deferred = [r for r in phases.values() if r.outcome is Outcome.DEFER]
        agent_id = f"{agent.namespace}/{agent.metadata.name}"
        if failed:
            first = failed[0]
            last = LastUnschedulable(
                phase=first.phase,
                reason=first.reason,
                observed_at=self.now,
                crew_scheduling_policy=policy_name,
            )
            scheduled = self._condition("Scheduled", "False", "Unschedulable", first.reason)
            for result in failed:
                self._event(plan, result, agent_id)
        elif deferred:
            scheduled = self._condition(
                "Scheduled", "False", "SchedulingDeferred", deferred[0].reason
            )
        else:
            summary = "; ".join(f"{r.phase}: {r.model} on {r.provider}" for r in phases.values())
            scheduled = self._condition("Scheduled", "True", "Scheduled", summary)
        conditions = [scheduled]
        if note is not None:
            conditions.append(self._condition("PolicyResolved", "False", "NoPolicy", note))
        return AgentResult(agent, policy, phases, env, conditions, last)

    def _condition(self, kind: str, status: str, reason: str, message: str) -> Condition:
        return Condition.model_validate(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": self.now,
            }
        )

    def _event(self, plan: PolicyPlan, result: PhaseResult, agent_id: str) -> None:
        policy = plan.policy
        if policy is None:
            regarding = f"Agent/{agent_id}"  # no policy to carry it: the Agent does
        else:
            regarding = f"CrewSchedulingPolicy/{policy.namespace}/{policy.metadata.name}"
            self._unschedulable.setdefault(policy.key, []).append(
                f"{agent_id} phase {result.phase}"
            )
        message = result.failure_message or failed_scheduling_message(result.decision, result.phase)
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
                valid = self._condition(
                    "PolicyValid",
                    "False",
                    plan.problems[0][0],
                    "; ".join(message for _, message in plan.problems),
                )
            else:
                valid = self._condition(
                    "PolicyValid",
                    "True",
                    "Valid",
                    f"phases match MootArchetype {plan.archetype.metadata.name}",
                )
            failures = self._unschedulable.get(policy.key, [])
            if failures:
                shown = ", ".join(failures[:5]) + (
                    f" and {len(failures) - 5} more" if len(failures) > 5 else ""
                )
                scheduled = self._condition(
                    "Scheduled", "False", "Unschedulable", f"unschedulable: {shown}"
                )
            else:
                scheduled = self._condition(
                    "Scheduled",
                    "True",
                    "Scheduled",
                    "every governed Agent phase is bound or waits on evidence",
                )
            policies.append(PolicyResult(policy, [valid, scheduled]))
        return ScheduleResult(
            now=self.now,
            scheduler_version=SCHEDULER_VERSION,
            agents=list(self._agents),
            events=list(self._events.values()),
            policies=policies,
        )


def schedule_bundle(
    bundle: Bundle | ClusterSnapshot,
    *,
    now: datetime,
    config: KubemootConfig | None = None,
) -> ScheduleResult:
    """Schedule every Agent of a bundle (or snapshot) at ``now``."""
    snapshot = (
        bundle
        if isinstance(bundle, ClusterSnapshot)
        else ClusterSnapshot.from_bundle(bundle, config=config)
    )
    scheduling = SchedulingPass(snapshot, now=now)
    for agent in sorted(snapshot.agents, key=lambda a: (a.namespace or "", a.metadata.name)):
        scheduling.schedule(agent)
    return scheduling.result()


def schedule_agent(agent: Agent, snapshot: ClusterSnapshot, now: datetime) -> AgentResult:
    """Schedule one Agent alone (the operator's reconcile of a single Agent)."""
    return SchedulingPass(snapshot, now=now).schedule(agent)
