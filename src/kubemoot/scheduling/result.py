"""What a scheduling pass produces: per-phase bindings, per-Agent status, events.

The values are plain and frozen where they can be. A phase's full decision record is
built on first use (:attr:`PhaseResult.decision`), and so are an Agent's phase results,
env and conditions (:class:`AgentResult`): a pass over thousands of agents keeps only
what it needs to build them, and they are identical either way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, overload

from kubemoot.api import (
    Agent,
    AgentScheduling,
    Condition,
    CrewSchedulingPolicy,
    DecisionSummary,
    GateFailure,
    LastUnschedulable,
    Phase,
    PhaseBinding,
    PhaseCandidate,
)
from kubemoot.api.agent import SUMMARY_FAILURES, SUMMARY_TEXT, SUMMARY_TRIGGERS
from kubemoot.gates import DecisionRecord, Outcome
from kubemoot.scheduling.bind import CandidateList, env_score
from kubemoot.scheduling.candidate import Placement, rfc3339
from kubemoot.scheduling.warnings import ObjectWarning

__all__ = [
    "AgentResult",
    "AgentResults",
    "PhaseResult",
    "PolicyResult",
    "Row",
    "RowBatch",
    "ScheduleResult",
    "SchedulingEvent",
    "SharedBinding",
]


def policy_version(policy: CrewSchedulingPolicy) -> str:
    """A digest of the policy's spec: which version of the policy a decision used.

    Not ``metadata.generation``: a bundle given to ``kubemoot schedule`` has none, and
    a digest also says whether two clusters decided with the same policy.
    """
    spec = policy.to_manifest().get("spec") or {}
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _clip(text: str) -> str:
    return text if len(text) <= SUMMARY_TEXT else text[: SUMMARY_TEXT - 1] + "…"


@dataclass(slots=True)
class PhaseResult:
    """The outcome of one phase of one Agent."""

    phase: str
    outcome: Outcome
    placement: Placement | None
    score: float | None
    candidates: CandidateList
    reason: str
    _decide: Callable[[], DecisionRecord] = field(repr=False)
    _record: DecisionRecord | None = field(default=None, repr=False)
    #: For UNSCHEDULABLE: the FailedScheduling message (``0/N models are available …``).
    failure_message: str | None = None
    #: Summaries shared by the Agents of one binding group, by phase (see :meth:`summary`).
    _summaries: dict[str, DecisionSummary] | None = field(default=None, repr=False)

    @property
    def decision(self) -> DecisionRecord:
        """The phase's decision record (gate results of every candidate, scores, reason)."""
        if self._record is None:
            self._record = self._decide()
        return self._record

    @property
    def model(self) -> str | None:
        """Bound Model resource name."""
        return None if self.placement is None else self.placement.name

    @property
    def model_id(self) -> str | None:
        """Bound model identifier (``spec.model``)."""
        return None if self.placement is None else self.placement.model_id

    @property
    def provider(self) -> str | None:
        """Bound provider name."""
        return None if self.placement is None else self.placement.model.spec.provider_ref

    @property
    def endpoint(self) -> str | None:
        """Bound provider endpoint."""
        provider = None if self.placement is None else self.placement.provider
        return None if provider is None else provider.spec.endpoint

    def to_dict(self, *, decision: bool = True) -> dict[str, Any]:
        """JSON-ready, camelCase, as ``kubemoot schedule -o json`` prints it."""
        data: dict[str, Any] = {
            "outcome": self.outcome.value,
            "model": self.model,
            "modelId": self.model_id,
            "provider": self.provider,
            "endpoint": self.endpoint,
            "score": self.score,
            "candidates": [{"model": m, "score": env_score(s)} for m, s in self.candidates],
            "reason": self.reason,
        }
        if decision:
            data["decision"] = self.decision.to_dict()
        return data

    def summary(self, *, policy_version: str | None = None) -> DecisionSummary:
        """The bounded summary of :attr:`decision` that ``Agent.status`` keeps.

        Agents that share a binding group (one policy, one effective bias, the same
        bindings) share one summary: replaying the full record for each of thousands of
        Agents would cost a decision per Agent for counts that differ, if at all, only
        by the agent slots the Agents before it took.
        """
        cache = self._summaries
        found = None if cache is None else cache.get(self.phase)
        if found is not None and found.policy_version == policy_version:
            return found
        made = self._summarize(policy_version)
        if cache is not None:
            cache[self.phase] = made
        return made

    def _summarize(self, policy_version: str | None) -> DecisionSummary:
        record = self.decision
        by_gate: dict[str, tuple[int, str]] = {}
        for cid in record.hard_failed:
            failures = record.candidates[cid].failures
            if not failures:
                continue
            first = failures[0]  # the gate that put the candidate out
            count, reason = by_gate.get(first.gate, (0, first.reason))
            by_gate[first.gate] = (count + 1, reason)
        top = sorted(by_gate.items(), key=lambda item: (-item[1][0], item[0]))
        return DecisionSummary(
            feasible=len(record.feasible),
            uncertain=len(record.uncertain),
            failed=len(record.hard_failed),
            top_failures=[
                GateFailure(gate=gate, count=count, reason=_clip(reason))
                for gate, (count, reason) in top[:SUMMARY_FAILURES]
            ],
            scheduler_version=record.scheduler_version,
            scoring_policy_version=record.scoring_policy_version,
            policy_version=policy_version,
            recheck_triggers=[_clip(t) for t in record.recheck_triggers[:SUMMARY_TRIGGERS]],
        )

    def binding(self, *, summary: DecisionSummary | None = None) -> PhaseBinding:
        """The ``status.scheduling.phases[phase]`` entry."""
        return PhaseBinding(
            decision=summary,
            model=self.model,
            model_id=self.model_id,
            provider=self.provider,
            endpoint=self.endpoint,
            score=self.score,
            outcome=self.outcome.value,
            reason=self.reason,
            candidates=[PhaseCandidate(model=m, score=s) for m, s in self.candidates],
        )


class SharedBinding(Protocol):
    """Where an :class:`AgentResult` reads the parts it shares with similar Agents."""

    @property
    def policy(self) -> CrewSchedulingPolicy | None: ...

    def phase_results(self, subject: str, position: int) -> dict[str, PhaseResult]: ...

    def env(self) -> dict[str, str]: ...

    def conditions(self) -> list[Condition]: ...

    def last_unschedulable(self, agent: Agent) -> LastUnschedulable | None: ...

    @property
    def bound(self) -> tuple[str, ...]:
        """The distinct providers each of its Agents is bound to (assumed by the pass)."""
        ...


Row = tuple[Agent, SharedBinding, int]


class RowBatch(Protocol):
    """Rows a pass recorded together, written out only when the results are read."""

    def __len__(self) -> int: ...

    def rows(self) -> Iterable[Row]: ...


@dataclass(frozen=True, slots=True)
class _OneRow:
    """A single row recorded after a batch."""

    row: Row

    def __len__(self) -> int:
        return 1

    def rows(self) -> Iterable[Row]:
        return (self.row,)


class AgentResult:
    """Everything the scheduler decided for one Agent.

    A pass decides once for every Agent with the same policy and effective bias
    (:mod:`kubemoot.scheduling.group`); an Agent's phase results, env and conditions are
    built from that shared decision when first read, and are its own from then on.
    Built directly (``AgentResult(agent, policy, phases, env, conditions, last)``), it
    simply holds the values given.
    """

    __slots__ = (
        "_conditions",
        "_env",
        "_last",
        "_last_known",
        "_phases",
        "_position",
        "_shared",
        "agent",
        "policy",
        "preferred",
    )

    def __init__(
        self,
        agent: Agent,
        policy: CrewSchedulingPolicy | None,
        phases: dict[str, PhaseResult] | None = None,
        env: dict[str, str] | None = None,
        conditions: list[Condition] | None = None,
        last_unschedulable: LastUnschedulable | None = None,
        preferred: str = Phase.MULLING,
        *,
        shared: SharedBinding | None = None,
        position: int = 0,
    ) -> None:
        self.agent = agent
        self.policy = policy
        self.preferred = preferred
        self._shared = shared
        self._position = position  # bindings the pass had assumed before this Agent
        self._phases = phases if phases is not None or shared is not None else {}
        self._env = env if env is not None or shared is not None else {}
        self._conditions = conditions if conditions is not None or shared is not None else []
        self._last = last_unschedulable
        self._last_known = shared is None

    @classmethod
    def shared_by(cls, agent: Agent, shared: SharedBinding, position: int) -> AgentResult:
        """The result of an Agent bound by a shared decision, after ``position`` bindings.

        The pass makes one per Agent, so it sets the slots directly instead of going
        through the general constructor's defaults.
        """
        result = cls.__new__(cls)
        result.agent = agent
        result.policy = shared.policy
        result.preferred = Phase.MULLING
        result._shared = shared
        result._position = position
        result._phases = result._env = result._conditions = result._last = None
        result._last_known = False
        return result

    def __repr__(self) -> str:
        return f"AgentResult({self.namespace}/{self.name}, policy={self.policy_name})"

    @property
    def policy_name(self) -> str | None:
        """The governing CrewSchedulingPolicy's name, if any."""
        return None if self.policy is None else self.policy.metadata.name

    @property
    def phases(self) -> dict[str, PhaseResult]:
        """Per-phase results, in scheduling order."""
        if self._phases is None:
            assert self._shared is not None
            subject = f"Agent/{self.agent.namespace}/{self.agent.metadata.name}"
            self._phases = self._shared.phase_results(subject, self._position)
        return self._phases

    @property
    def env(self) -> dict[str, str]:
        """The Deployment env vars the binding templates."""
        if self._env is None:
            assert self._shared is not None
            self._env = self._shared.env()
        return self._env

    @property
    def conditions(self) -> list[Condition]:
        """``Scheduled`` (and ``PolicyResolved`` when no single policy governs)."""
        if self._conditions is None:
            assert self._shared is not None
            self._conditions = self._shared.conditions()
        return self._conditions

    @property
    def last_unschedulable(self) -> LastUnschedulable | None:
        """This pass's UNSCHEDULABLE phase, else what the Agent's status recorded."""
        if not self._last_known:
            assert self._shared is not None
            self._last = self._shared.last_unschedulable(self.agent)
            self._last_known = True
        return self._last

    @property
    def namespace(self) -> str:
        return self.agent.namespace or "default"

    @property
    def name(self) -> str:
        return self.agent.metadata.name

    def scheduling(self, *, summaries: bool = False) -> AgentScheduling:
        """``Agent.status.scheduling``: the preferred (mulling) binding plus every phase.

        ``summaries`` adds each phase's bounded decision summary (what the operator
        writes); building it replays the phase's full decision record.
        """
        preferred = self.phases.get(self.preferred)
        version = None if self.policy is None or not summaries else policy_version(self.policy)
        return AgentScheduling(
            model=None if preferred is None else preferred.model,
            model_id=None if preferred is None else preferred.model_id,
            provider=None if preferred is None else preferred.provider,
            endpoint=None if preferred is None else preferred.endpoint,
            phases={
                phase: result.binding(
                    summary=result.summary(policy_version=version) if summaries else None
                )
                for phase, result in self.phases.items()
            },
            last_unschedulable=self.last_unschedulable,
        )

    def to_dict(self, *, decisions: bool = True) -> dict[str, Any]:
        """JSON-ready, camelCase."""
        scheduling = self.scheduling()
        return {
            "namespace": self.namespace,
            "name": self.name,
            "crewSchedulingPolicy": self.policy_name,
            "model": scheduling.model,
            "provider": scheduling.provider,
            "endpoint": scheduling.endpoint,
            "phases": {p: r.to_dict(decision=decisions) for p, r in self.phases.items()},
            "env": dict(self.env),
            "conditions": [
                c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in self.conditions
            ],
            "lastUnschedulable": None
            if self.last_unschedulable is None
            else self.last_unschedulable.model_dump(mode="json", by_alias=True, exclude_none=True),
        }


class AgentResults(Sequence[AgentResult]):
    """A pass's Agent results in pass order, each made when first read.

    The pass records one row per Agent, (Agent, shared decision, bindings assumed
    before it), which is all an :class:`AgentResult` is built from; a pass over tens of
    thousands of Agents then makes none it is not asked for. Rows can also arrive as
    batches (a run of Agents that shared their decisions), written out as rows when
    the results are first read. A result, once made, is the same object on every read.
    """

    __slots__ = ("_count", "_made", "_pending", "_rows")

    def __init__(
        self,
        rows: list[Row] | None = None,
        made: dict[int, AgentResult] | None = None,
        pending: list[RowBatch] | None = None,
    ) -> None:
        self._rows: list[Row] = [] if rows is None else rows
        self._made: dict[int, AgentResult] = {} if made is None else made
        self._pending: list[RowBatch] = [] if pending is None else pending
        self._count = len(self._rows) + sum(map(len, self._pending))

    def add(self, row: Row) -> None:
        """One Agent's row, after every row and batch added so far."""
        if self._pending:
            self._pending.append(_OneRow(row))  # after the batches, still unwritten
        else:
            self._rows.append(row)
        self._count += 1

    def add_batch(self, batch: RowBatch) -> None:
        """A batch of rows, written out when first read."""
        self._pending.append(batch)
        self._count += len(batch)

    @property
    def rows(self) -> list[Row]:
        """Every row, in pass order (batches are written out now)."""
        if self._pending:
            extend = self._rows.extend
            for batch in self._pending:
                extend(batch.rows())
            self._pending.clear()
        return self._rows

    def copy(self) -> AgentResults:
        """The results so far: later rows are not seen; results made are shared."""
        return AgentResults(list(self._rows), self._made, list(self._pending))

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> AgentResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[AgentResult]: ...

    def __getitem__(self, index: int | slice) -> AgentResult | list[AgentResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        found = self._made.get(index)
        if found is None:
            if not 0 <= index < self._count:
                raise IndexError("AgentResults index out of range")
            agent, shared, position = self.rows[index]
            found = self._made[index] = AgentResult.shared_by(agent, shared, position)
        return found

    def __iter__(self) -> Iterator[AgentResult]:
        for index in range(self._count):
            yield self[index]

    def __repr__(self) -> str:
        return f"AgentResults({self._count} agents)"


@dataclass(slots=True)
class SchedulingEvent:
    """A Kubernetes Event to emit; repeats of one message are counted, as kube does."""

    type: str
    reason: str
    regarding: str
    message: str
    count: int = 1
    agents: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "reason": self.reason,
            "regarding": self.regarding,
            "message": self.message,
            "count": self.count,
            "agents": list(self.agents),
        }


@dataclass(slots=True)
class PolicyResult:
    """Conditions the pass sets on one CrewSchedulingPolicy."""

    policy: CrewSchedulingPolicy
    conditions: list[Condition]

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.policy.namespace,
            "name": self.policy.metadata.name,
            "conditions": [
                c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in self.conditions
            ],
        }


@dataclass(slots=True)
class ScheduleResult:
    """The result of one pass: every Agent, the events and the policies' conditions."""

    now: datetime
    scheduler_version: str
    agents: Sequence[AgentResult]
    events: list[SchedulingEvent]
    policies: list[PolicyResult]
    #: What is well-formed but almost surely a mistake (a providerRef naming nothing).
    warnings: list[ObjectWarning] = field(default_factory=list)

    def agent(self, namespace: str, name: str) -> AgentResult | None:
        """One Agent's result."""
        return next((a for a in self.agents if a.namespace == namespace and a.name == name), None)

    def to_dict(self, *, decisions: bool = True) -> dict[str, Any]:
        """The JSON document of ``kubemoot schedule -o json``."""
        data = {
            "schedulerVersion": self.scheduler_version,
            "now": rfc3339(self.now),
            "agents": [agent.to_dict(decisions=decisions) for agent in self.agents],
            "events": [event.to_dict() for event in self.events],
            "policies": [policy.to_dict() for policy in self.policies],
        }
        if self.warnings:  # absent when there are none, so clean bundles print as before
            data["warnings"] = [warning.to_dict() for warning in self.warnings]
        return data
