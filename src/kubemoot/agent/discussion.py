"""A minimal discussion engine: enough of a crew to drive the scheduler end to end.

A :class:`Thread` carries one question. The :class:`Coordinator` selects agents for it
and, for each, plans the first mulling call at once (planning at selection), so loads
overlap triage. Every selected agent triages on its bound triage model with a short
call that never waits, then mulls through the per-call runtime (which may wait for a
GPU) and signals ``agree``/``concern`` with the call's attribution — or ``stand_aside``
with a capacity reason, or ``failure`` when its own machinery tripped. When every agent
has spoken, or the discussion deadline passes, the coordinator settles: a synthesis call
(which never waits, and never goes to an endpoint whose context would cut its prompt)
when any position arrived; otherwise the capacity answer, or a plain no-contribution
note. Positions here are derived deterministically from the reply text: this engine
exists to exercise placement, not to reach real consensus.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubemoot import metrics
from kubemoot.agent.answers import CapacityRecord, capacity_answer
from kubemoot.agent.runtime import AgentRuntime, CallOutcome, StaticTarget
from kubemoot.agent.signals import (
    CallbackSink,
    FailureType,
    ListSink,
    Signal,
    SignalMetadata,
    SignalSink,
    SignalType,
)
from kubemoot.agent.toolloop import Tool
from kubemoot.api import Phase
from kubemoot.runtime.placement import CandidateModel
from kubemoot.runtime.refusals import Reason
from kubemoot.settings import DEFAULTS

__all__ = [
    "AgentProfile",
    "Coordinator",
    "DiscussionResult",
    "Evaluate",
    "Settlement",
    "Thread",
]

log = logging.getLogger(__name__)

TRIAGE = Phase.TRIAGE
MULLING = Phase.MULLING
SYNTHESIS = Phase.SYNTHESIS

NO_CONTRIBUTION_TEXT = "No selected agent took a position on this question."

Evaluate = Callable[["AgentProfile", "Thread", asyncio.Event, SignalSink], Awaitable[None]]
"""One selected member's part in a thread: ``evaluate(member, thread, done, sink)``."""


@dataclass(frozen=True, slots=True)
class AgentProfile:
    """What the runtime needs of one agent: its candidates per phase and bindings."""

    id: str  # namespace/name
    role: str  # coordinator, tooler, analyst…
    mulling: tuple[CandidateModel, ...]  # preferred first, as the control plane published
    triage: tuple[CandidateModel, ...] = ()
    mulling_static: StaticTarget | None = None
    triage_static: StaticTarget | None = None
    system_prompt: str = "You are a member of an engineering crew."
    tools: tuple[Tool, ...] = ()
    # phase → FailedScheduling message, for the phases the operator could not bind: the
    # agent makes no call in them (the spec) and stands aside with the message
    unschedulable: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Thread:
    id: str
    question: str


class Settlement(StrEnum):
    """How a discussion ended."""

    SYNTHESIS = "synthesis"  # positions arrived and the coordinator synthesised them
    CAPACITY = "capacity"  # nobody spoke because no GPU could be had
    UNSCHEDULABLE = "unschedulable"  # nobody spoke: their phase has no binding at all
    NO_CONTRIBUTION = "no-contribution"  # nobody spoke, for other reasons
    FAILED = "failed"  # positions arrived but the synthesis call itself failed


@dataclass(slots=True)
class DiscussionResult:
    thread: Thread
    settlement: Settlement
    answer: str
    signals: list[Signal] = field(default_factory=list)
    selected: list[str] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.settlement is Settlement.SYNTHESIS

    def positions(self) -> list[Signal]:
        return [s for s in self.signals if s.is_position]

    def stand_asides(self) -> list[Signal]:
        return [s for s in self.signals if s.type is SignalType.STAND_ASIDE]

    def to_dict(self) -> dict[str, Any]:
        return {
            "threadId": self.thread.id,
            "question": self.thread.question,
            "settlement": self.settlement.value,
            "answered": self.answered,
            "answer": self.answer,
            "selected": list(self.selected),
            "signals": [s.to_dict() for s in self.signals],
        }


def _position(content: str) -> SignalType:
    """A deterministic stand-in for judging a reply: about one in four is a concern."""
    digest = hashlib.sha256(content.encode("utf-8")).digest()
    return SignalType.CONCERN if digest[0] % 4 == 0 else SignalType.AGREE


class Coordinator:
    """Runs discussions for one crew's coordinator over the shared agent runtime."""

    def __init__(
        self,
        runtime: AgentRuntime,
        profile: AgentProfile,
        *,
        sink: SignalSink | None = None,
        deadline_seconds: float = DEFAULTS.gpu_wait_limit_seconds,
        evaluate: Evaluate | None = None,
    ) -> None:
        """``evaluate`` runs a member's part elsewhere (its own process); that member
        then plans at selection itself, so the coordinator does not plan for it."""
        self.runtime = runtime
        self.profile = profile
        self._sink = sink
        self.deadline_seconds = deadline_seconds
        self._remote = evaluate

    def select(self, thread: Thread, members: Sequence[AgentProfile]) -> list[AgentProfile]:
        """Which members take part: every member with a mulling candidate, and every
        member whose mulling is unschedulable (it says so instead of calling)."""
        return [m for m in members if m.mulling or MULLING in m.unschedulable]

    async def discuss(self, thread: Thread, members: Sequence[AgentProfile]) -> DiscussionResult:
        record = ListSink()
        sink = CallbackSink(record.emit)
        if self._sink is not None:
            sink.add(self._sink.emit)
        await self._advise(thread)
        selected = self.select(thread, members)
        held_plans = self.runtime.held_plans
        for member in selected if self._remote is None else ():
            try:
                await held_plans.commit_to_thread(member.id, thread.id, member.mulling)
            except Exception as error:  # planning ahead is an optimisation, never fatal
                metrics.survived("agent", "plan", metrics.STORE,
                                 f"planning at selection failed for {member.id}", error,
                                 logger=log)
        done = asyncio.Event()
        evaluate = self._remote or self.evaluate
        tasks = [
            asyncio.ensure_future(evaluate(member, thread, done, sink))
            for member in selected
        ]
        try:
            if tasks:
                gathered = asyncio.gather(*tasks, return_exceptions=True)
                with contextlib.suppress(TimeoutError):
                    await self.runtime.clock.wait_for(
                        asyncio.shield(gathered), self.deadline_seconds
                    )
            done.set()  # wakes every agent still waiting for a GPU: it stands aside
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for task in tasks:
                task.cancel()
            # On cancellation the members are still unwinding (releasing tickets and
            # plans); wait for them, so whoever cancelled us can then close the store.
            await asyncio.gather(*tasks, return_exceptions=True)
            await held_plans.close_thread(thread.id)
        still_waiting = _still_waiting(record.signals)
        settlement, answer = await self._settle(thread, record.signals, still_waiting, sink)
        return DiscussionResult(thread, settlement, answer, record.signals,
                                [m.id for m in selected])

    async def _advise(self, thread: Thread) -> str | None:
        """The coordinator's own triage of the question (advisory: it never waits, and
        the discussion goes on without it)."""
        if not self.profile.triage:
            return None
        messages = [
            {"role": "system", "content": "Name the specialists this question needs."},
            {"role": "user", "content": thread.question},
        ]
        outcome = await self.runtime.call(
            agent=self.profile.id, thread_id=thread.id, phase=TRIAGE, messages=messages,
            candidates=self.profile.triage[:1], wait=False, static=self.profile.triage_static,
        )
        return outcome.result.content if outcome.result is not None else None

    # -- one agent -----------------------------------------------------------------

    async def evaluate(
        self, agent: AgentProfile, thread: Thread, done: asyncio.Event, sink: SignalSink
    ) -> None:
        """``agent``'s part in ``thread`` on this process's runtime: triage, mulling
        (until ``done`` is set), one signal. A member process serving a remote
        coordinator calls this for its own agent."""
        await self._evaluate(agent, thread, done, sink)

    async def _evaluate(
        self, agent: AgentProfile, thread: Thread, done: asyncio.Event, sink: SignalSink
    ) -> None:
        clock = self.runtime.clock
        unschedulable = agent.unschedulable.get(MULLING)
        if unschedulable is not None:
            # no binding, no call: the phase stands aside with the operator's reason
            sink.emit(Signal(SignalType.STAND_ASIDE, agent.id, thread.id, clock.now(),
                             phase=MULLING, content=unschedulable,
                             metadata=SignalMetadata(reason=Reason.UNSCHEDULABLE)))
            return
        try:
            note = await self._triage(agent, thread, sink)
            if note is None:
                return
            messages = [
                {"role": "system", "content": agent.system_prompt},
                {"role": "user", "content": f"{thread.question}\n\nTriage note: {note}"},
            ]
            outcome = await self.runtime.call(
                agent=agent.id, thread_id=thread.id, phase=MULLING, messages=messages,
                candidates=agent.mulling, tools=agent.tools, wait=True, done=done,
                sink=sink, held_plan=True,
            )
            self._signal_outcome(agent, thread, outcome, sink, MULLING)
        except Exception as error:  # a bug or a store outage: a failure, not a crash
            metrics.survived("agent", "evaluate", metrics.BUG,
                             f"agent {agent.id} failed in thread {thread.id}",
                             logger=log, exc_info=True)
            sink.emit(Signal(
                SignalType.FAILURE, agent.id, thread.id, clock.now(), phase=MULLING,
                metadata=SignalMetadata(failure_type=FailureType.AGENT_ERROR.value,
                                        last_error=f"{type(error).__name__}: {error}"),
            ))
        finally:
            # a plan nobody took (stood aside, failed) must not keep its memory; when the
            # store refuses, the plan's TTL frees it
            try:
                await self.runtime.held_plans.release(agent.id, thread.id)
            except Exception as error:
                metrics.survived("agent", "release-plan", metrics.STORE,
                                 f"releasing the plan of {agent.id} for thread "
                                 f"{thread.id} failed; its TTL will free it", error,
                                 logger=log)

    async def _triage(self, agent: AgentProfile, thread: Thread, sink: SignalSink) -> str | None:
        """A short call on the bound triage model; ``None`` when the agent is done."""
        if not agent.triage:
            return "no triage model bound"
        messages = [
            {"role": "system", "content": "In one sentence: can you help with this?"},
            {"role": "user", "content": thread.question},
        ]
        outcome = await self.runtime.call(
            agent=agent.id, thread_id=thread.id, phase=TRIAGE, messages=messages,
            candidates=agent.triage[:1], wait=False, static=agent.triage_static,
        )
        if outcome.result is None:
            # triage never waits; without it the agent still mulls (it was selected)
            return f"triage skipped ({outcome.refusal})"
        if not outcome.result.ok:
            self._signal_outcome(agent, thread, outcome, sink, TRIAGE)
            return None
        return outcome.result.content

    def _signal_outcome(
        self,
        agent: AgentProfile,
        thread: Thread,
        outcome: CallOutcome,
        sink: SignalSink,
        phase: str,
    ) -> None:
        now = self.runtime.clock.now()
        metadata = outcome.metadata()
        if outcome.result is None:
            kind = SignalType.STAND_ASIDE
            content = ""
        elif not outcome.result.ok:
            kind, content = SignalType.FAILURE, ""
        else:
            content = outcome.result.content
            kind = _position(content)
        sink.emit(Signal(kind, agent.id, thread.id, now, phase=phase, content=content,
                         metadata=metadata))

    # -- settling ------------------------------------------------------------------

    async def _settle(
        self,
        thread: Thread,
        signals: list[Signal],
        still_waiting: set[str],
        sink: SignalSink,
    ) -> tuple[Settlement, str]:
        positions = [s for s in signals if s.is_position]
        if not positions:
            record = CapacityRecord.from_signals(signals, still_waiting=still_waiting)
            answer = capacity_answer(record)
            if answer is not None:
                # only unschedulable phases kept the agents quiet: not the GPUs' doing
                return (Settlement.CAPACITY if record.capacity
                        else Settlement.UNSCHEDULABLE), answer
            return Settlement.NO_CONTRIBUTION, NO_CONTRIBUTION_TEXT
        own = self.profile.unschedulable.get(MULLING)
        if own is not None:
            # the coordinator's own phase has no binding: no synthesis call is made
            sink.emit(Signal(SignalType.STAND_ASIDE, self.profile.id, thread.id,
                             self.runtime.clock.now(), phase=SYNTHESIS, content=own,
                             metadata=SignalMetadata(reason=Reason.UNSCHEDULABLE)))
            return Settlement.FAILED, (f"The coordinator could not write the answer: its "
                                       f"mulling phase is unschedulable ({own}).")
        summary = "\n".join(f"- {s.agent} ({s.type.value}): {s.content}" for s in positions)
        messages = [
            {"role": "system", "content": self.profile.system_prompt},
            {"role": "user", "content": f"Question: {thread.question}\n\nPositions:\n{summary}"
             "\n\nWrite the crew's answer."},
        ]
        candidates = self.profile.mulling or self.profile.triage
        # The synthesis never waits: when no acceptable model can be had now, a lesser
        # candidate that can run at once beats keeping the crew's answer back.
        outcome = await self.runtime.call(
            agent=self.profile.id, thread_id=thread.id, phase=SYNTHESIS, messages=messages,
            candidates=candidates, wait=False, static=self.profile.mulling_static,
            fallbacks=candidates[1:],
        )
        if outcome.result is not None and outcome.result.ok:
            return Settlement.SYNTHESIS, outcome.result.content
        # A coordinator call fails visibly rather than answering from a cut prompt.
        metadata = outcome.metadata()
        sink.emit(Signal(SignalType.FAILURE, self.profile.id, thread.id,
                         self.runtime.clock.now(), phase=SYNTHESIS, metadata=metadata))
        why = outcome.refusal or (
            outcome.result.failure.last_error
            if outcome.result is not None and outcome.result.failure is not None else "unknown"
        )
        return Settlement.FAILED, f"The coordinator could not write the answer: {why}."


def _still_waiting(signals: Sequence[Signal]) -> set[str]:
    """Agents whose latest signal is ``waiting``."""
    last: dict[str, SignalType] = {}
    for signal in signals:
        last[signal.agent] = signal.type
    return {agent for agent, kind in last.items() if kind is SignalType.WAITING}
