"""Binding groups: one decision shared by the Agents it fits.

Inside one pass, the phases of an Agent are decided by its policy (rule tables, phase
order, spread), its effective bias (which ranking it walks) and the bindings assumed
so far (which providers are full). Agents that resolve to the same policy with the same
effective bias therefore get the same bindings for as long as the providers those
bindings use keep headroom: assumed bindings only grow, so a provider that was full
stays full and one that still has room leaves the walk where it was. A
:class:`BindingGroup` is that shared decision; the scheduler checks that it still holds
before reusing it and decides afresh when it does not.

An Agent keeps only what is its own: its name and how many bindings the pass had
assumed before it. The pass records that as one row per Agent; its
:class:`~kubemoot.scheduling.result.AgentResult`, phase results, env and conditions are
built from the group when first read, so a pass over tens of thousands of Agents makes
one tuple per Agent and no result nobody reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Protocol

from kubemoot.api import (
    Agent,
    Condition,
    CrewSchedulingPolicy,
    DecisionSummary,
    LastUnschedulable,
    Phase,
)
from kubemoot.gates import DecisionRecord, Outcome
from kubemoot.scheduling.bind import (
    ENV_CANDIDATES,
    ENV_MODEL,
    ENV_MODEL_ENDPOINT,
    ENV_MODEL_SIZES,
    ENV_TRIAGE_ENDPOINT,
    ENV_TRIAGE_MODEL_ID,
    ENV_UNSCHEDULABLE,
    CandidateList,
    sizes_json,
)
from kubemoot.scheduling.plugins import SpreadContext
from kubemoot.scheduling.result import PhaseResult, Row
from kubemoot.scheduling.roster import Segment
from kubemoot.scheduling.tables import Ranked, Ranking

__all__ = ["AgentRun", "BindingGroup", "GroupContext", "PhasePlan"]


@dataclass(frozen=True, slots=True)
class PhasePlan:
    """How one phase came out for a group: the chosen candidate, or why there is none."""

    phase: str
    ranking: Ranking
    outcome: Outcome
    chosen: Ranked | None
    #: The reason, or (DEFER) a cached function that writes it when first read.
    why: str | Callable[[], str]
    context: SpreadContext | None  # the spread state the phase was judged with
    failure_message: str | None = None  # UNSCHEDULABLE: the FailedScheduling message

    @property
    def reason(self) -> str:
        why = self.why
        return why if isinstance(why, str) else why()

    @property
    def endpoint(self) -> str | None:
        provider = None if self.chosen is None else self.chosen.placement.provider
        return None if provider is None else provider.spec.endpoint


class GroupContext(Protocol):
    """What a group reads from its pass when an Agent's result is first read."""

    now: datetime

    def candidates(self, ranking: Ranking, bound: str | None) -> CandidateList: ...

    def candidates_json(self, candidates: CandidateList) -> str: ...

    def declared_sizes(self, ranking: Ranking) -> Mapping[str, int]: ...

    def decision(
        self, ranking: Ranking, subject: str, position: int, spread: SpreadContext | None
    ) -> DecisionRecord: ...

    def condition(self, kind: str, status: str, reason: str, message: str) -> Condition: ...


@dataclass(slots=True, eq=False)
class BindingGroup:
    """The bindings shared by Agents with one policy resolution and one effective bias."""

    context: GroupContext
    policy: CrewSchedulingPolicy | None
    note: str | None  # why no policy (or which of several) governs these Agents
    phases: tuple[PhasePlan, ...]
    #: Saturation version of the pass at which the group was last known to hold.
    version: int
    #: The PolicyResolved reason (see :class:`~kubemoot.scheduling.snapshot.PolicyResolution`).
    resolved: str = "PolicyMatched"
    bound: tuple[str, ...] = field(init=False)  # distinct providers the group binds
    failed: tuple[PhasePlan, ...] = field(init=False)  # UNSCHEDULABLE phases
    unplaced: bool = field(init=False)  # some phase has no binding
    #: (provider, the assumed count at which it fills up, 0 for no limit), set by the pass.
    limits: tuple[tuple[str, int], ...] = field(init=False)
    _env: dict[str, str] | None = None
    _conditions: list[Condition] | None = None
    _last: LastUnschedulable | None = None
    _summaries: dict[str, DecisionSummary] = field(default_factory=dict)

    def __post_init__(self) -> None:
        chosen = [plan.chosen.provider for plan in self.phases if plan.chosen is not None]
        self.bound = tuple(dict.fromkeys(chosen))
        self.failed = tuple(p for p in self.phases if p.outcome is Outcome.UNSCHEDULABLE)
        self.unplaced = len(chosen) < len(self.phases)
        self.limits = ()

    # ------------------------------------------------------------------ per Agent

    def phase_results(self, subject: str, position: int) -> dict[str, PhaseResult]:
        """One Agent's phase results; ``position`` = bindings assumed before it."""
        context = self.context
        results: dict[str, PhaseResult] = {}
        for plan in self.phases:
            decide: Callable[[], DecisionRecord] = partial(
                context.decision,
                plan.ranking,
                f"{subject} phase {plan.phase}",
                position,
                plan.context,
            )
            chosen = plan.chosen
            if chosen is None:
                results[plan.phase] = PhaseResult(
                    plan.phase,
                    plan.outcome,
                    None,
                    None,
                    context.candidates(plan.ranking, None),
                    plan.reason,
                    decide,
                    failure_message=plan.failure_message,
                    _summaries=self._summaries,
                )
            else:
                placement = chosen.placement
                results[plan.phase] = PhaseResult(
                    plan.phase,
                    Outcome.PLACE,
                    placement,
                    chosen.score,
                    context.candidates(plan.ranking, placement.model_id),
                    plan.reason,
                    decide,
                    _summaries=self._summaries,
                )
        return results

    def env(self) -> dict[str, str]:
        """The Deployment env vars (a fresh dict for each Agent)."""
        if self._env is None:
            self._env = self._build_env()
        return dict(self._env)

    def conditions(self) -> list[Condition]:
        """The Agent's conditions (fresh copies for each Agent)."""
        if self._conditions is None:
            self._conditions = self._build_conditions()
        return [condition.model_copy() for condition in self._conditions]

    def last_unschedulable(self, agent: Agent) -> LastUnschedulable | None:
        """This pass's failure if a phase is UNSCHEDULABLE, else what the Agent recorded."""
        if self.failed:
            if self._last is None:
                first = self.failed[0]
                self._last = LastUnschedulable(
                    phase=first.phase,
                    reason=first.reason,
                    observed_at=self.context.now,
                    crew_scheduling_policy=None if self.policy is None else self.policy.name,
                )
            return self._last.model_copy()
        status = agent.status
        if status is None or status.scheduling is None:
            return None
        return status.scheduling.last_unschedulable

    # ------------------------------------------------------------------ shared parts

    def _build_env(self) -> dict[str, str]:
        by_phase = {plan.phase: plan for plan in self.phases}
        env: dict[str, str] = {}
        mulling, triage = by_phase.get(Phase.MULLING), by_phase.get(Phase.TRIAGE)
        if mulling is not None and mulling.chosen is not None:
            env[ENV_MODEL] = mulling.chosen.placement.model_id
            env[ENV_MODEL_ENDPOINT] = mulling.endpoint or ""
        if triage is not None and triage.chosen is not None:
            env[ENV_TRIAGE_MODEL_ID] = triage.chosen.placement.model_id
            env[ENV_TRIAGE_ENDPOINT] = triage.endpoint or ""
        for plan in (mulling, triage):
            if plan is not None and plan.outcome is Outcome.UNSCHEDULABLE:
                # No call is made in a phase nothing can serve: the binding goes, the
                # reason takes its place (the operator removes the binding variables).
                env[ENV_UNSCHEDULABLE[plan.phase]] = plan.failure_message or plan.reason
        sizes: dict[str, int] = {}
        for phase, variable in ENV_CANDIDATES.items():
            plan = by_phase.get(phase)
            # A deferred phase writes neither its model nor its candidates: the agent
            # keeps its last binding whole, so the list never contradicts the model
            # (a list without the model the agent still calls would).
            if plan is not None and plan.chosen is not None:
                bound = plan.chosen.placement.model_id
                candidates = self.context.candidates(plan.ranking, bound)
                env[variable] = self.context.candidates_json(candidates)
                for model, mib in self.context.declared_sizes(plan.ranking).items():
                    sizes[model] = max(mib, sizes.get(model, 0))
        if any(variable in env for variable in ENV_CANDIDATES.values()):
            # Written with every binding, "{}" included: a Deployment patch only sets
            # variables, so a size a Model stops declaring must be overwritten, not dropped.
            env[ENV_MODEL_SIZES] = sizes_json(sizes)
        return env

    def _build_conditions(self) -> list[Condition]:
        condition = self.context.condition
        deferred = [p for p in self.phases if p.outcome is Outcome.DEFER]
        if self.failed:
            scheduled = condition("Scheduled", "False", "Unschedulable", self.failed[0].reason)
        elif deferred:
            scheduled = condition("Scheduled", "False", "SchedulingDeferred", deferred[0].reason)
        else:
            summary = "; ".join(
                f"{p.phase}: {p.chosen.placement.name} on {p.chosen.provider}"
                for p in self.phases
                if p.chosen is not None
            )
            scheduled = condition("Scheduled", "True", "Bound", summary)
        conditions = [scheduled]
        if self.note is None and self.policy is not None:
            conditions.append(condition("PolicyResolved", "True", self.resolved,
                                        f"governed by CrewSchedulingPolicy {self.policy.name}"))
        elif self.note is not None:
            # AmbiguousCrewRef still schedules with one policy, but a person must choose.
            conditions.append(condition("PolicyResolved", "False", self.resolved, self.note))
        return conditions


@dataclass(frozen=True, slots=True)
class AgentRun:
    """Agents ``start`` to ``end`` of a segment, bound by their groups' standing decisions.

    The pass records a run as one value; its rows, (Agent, group, bindings assumed
    before it), are written out when the results are first read.
    """

    segment: Segment
    start: int
    end: int
    groups: tuple[BindingGroup | None, ...]  # by slot; None for a slot not in the run
    slot_at: list[int] | None  # each position's slot; None: every Agent is in slot 0
    position: int  # bindings the pass had assumed before the run's first Agent

    def __len__(self) -> int:
        return self.end - self.start

    def rows(self) -> Iterator[Row]:
        agents, groups, slot_at = self.segment.agents, self.groups, self.slot_at
        position = self.position
        for index in range(self.start, self.end):
            group = groups[0 if slot_at is None else slot_at[index]]
            assert group is not None  # every slot in the run has its group
            yield agents[index], group, position
            position += len(group.bound)
