"""The agent runtime: one inference call, placed at the moment it is needed.

:meth:`AgentRuntime.call` is the path every model call of an agent takes:

1. estimate the prompt (characters ÷ the learned ratio, tool specs included);
2. place it — a mulling call first takes the plan held for it since selection, then
   places through the capacity waiter (which may wait for a GPU); calls that cannot
   wait (triage, the coordinator's synthesis) place once, share a warm copy when the
   only option is to queue at it, and otherwise fall back to a static endpoint only
   when that endpoint's context holds the prompt;
3. run the tool loop on the chat the pool holds for the placed provider and model,
   with the context of *that* provider;
4. report the provider's new state (the copy it just loaded is now resident) and
   release the ticket in a ``finally``;
5. record the call's attribution: the provider it really ran on, the model it really
   ran, what was evicted for it and how long it waited;
6. if the provider refused the connection before any byte was sent (and no engine
   answered yet), place the call once more with that provider excluded and run it
   there (DESIGN §5); nothing else is ever retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kubemoot import metrics
from kubemoot.agent.pool import CallSettings, ChatPool
from kubemoot.agent.signals import Signal, SignalMetadata, SignalSink, SignalType
from kubemoot.agent.tokens import TokenEstimator
from kubemoot.agent.toolloop import Tool, ToolLoopLimits, ToolLoopResult, run_tool_loop
from kubemoot.clock import Clock
from kubemoot.runtime.held_plans import SelectionPlanner
from kubemoot.runtime.placement import Action, Candidate, Placement
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.record import call_decision
from kubemoot.runtime.refusals import Reason
from kubemoot.runtime.waiting import CapacityWaiter
from kubemoot.store.protocol import StoreError

__all__ = [
    "AgentRuntime",
    "CallOutcome",
    "CallRecord",
    "SignalWaitSink",
    "StaticTarget",
    "UseBoard",
]

log = logging.getLogger(__name__)

AfterCall = Callable[[str], Awaitable[None]]
"""``after_call(provider)``: runs after a call and before its ticket is released."""


class UseBoard(Protocol):
    """The part of the DemandBoard a finished call writes (recent use)."""

    async def record_use(self, model: str) -> None: ...


@dataclass(frozen=True, slots=True)
class StaticTarget:
    """The endpoint the operator bound, for calls that cannot wait (spec: static)."""

    provider: str
    endpoint: str
    model: str
    context_length: int | None = None


@dataclass(frozen=True, slots=True)
class CallRecord:
    """Per-call attribution: where one model call really ran."""

    thread_id: str
    agent: str
    phase: str
    model: str | None
    provider: str | None
    endpoint: str | None
    action: str
    waited_seconds: float
    evicted: tuple[str, ...]
    started_at: float
    seconds: float
    ok: bool
    prompt_tokens: int | None = None
    model_calls: int = 0  # requests the engine received for this call (tool turns)
    reason: str | None = None
    failure_type: str | None = None
    # the placement's bounded decision summary (runtime.record.call_decision), so the
    # call log and `kubemoot ask -o json` say why the call ran where it did
    decision: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "threadId": self.thread_id,
            "agent": self.agent,
            "phase": self.phase,
            "model": self.model,
            "provider": self.provider,
            "endpoint": self.endpoint,
            "action": self.action,
            "waitedSeconds": round(self.waited_seconds, 3),
            "evicted": list(self.evicted),
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "promptTokens": self.prompt_tokens,
            "modelCalls": self.model_calls,
            "reason": self.reason,
            "failureType": self.failure_type,
            "decision": dict(self.decision) if self.decision is not None else None,
        }


@dataclass(slots=True)
class CallOutcome:
    """What one call came to: a loop result, or the reason it never ran."""

    placement: Placement | None = None
    result: ToolLoopResult | None = None
    refusal: str | None = None  # gpu-busy, model-too-large, prompt-too-large
    record: CallRecord | None = None
    model: str | None = None  # the model concerned (placed, or refused)

    @property
    def ran(self) -> bool:
        return self.result is not None

    def metadata(self) -> SignalMetadata:
        """Attribution for the signal this call leads to."""
        p = self.placement
        failure = self.result.failure if self.result is not None else None
        return SignalMetadata(
            provider=p.provider if p is not None and self.ran else None,
            model=self.model,
            evicted=p.evicted if p is not None and self.ran else (),
            reason=self.refusal,
            failure_type=failure.failure_type.value if failure is not None else None,
            failed_tool=failure.failed_tool if failure is not None else None,
            last_error=failure.last_error if failure is not None else None,
            waited_seconds=round(p.waited_seconds, 3) if p is not None else None,
        )


class SignalWaitSink:
    """The capacity waiter's progress reports, published as ``waiting``/``evaluating``."""

    def __init__(
        self, sink: SignalSink, *, agent: str, thread_id: str, phase: str, clock: Clock
    ) -> None:
        self._sink = sink
        self._agent = agent
        self._thread = thread_id
        self._phase = phase
        self._clock = clock

    async def waiting(self, *, model: str, reason: str) -> None:
        self._emit(SignalType.WAITING, SignalMetadata(model=model, reason=reason))

    async def evaluating(self, *, model: str, provider: str) -> None:
        self._emit(SignalType.EVALUATING, SignalMetadata(model=model, provider=provider))

    def _emit(self, kind: SignalType, metadata: SignalMetadata) -> None:
        self._sink.emit(Signal(kind, self._agent, self._thread, self._clock.now(),
                               phase=self._phase, metadata=metadata))


@dataclass(slots=True)
class _Books:
    records: list[CallRecord] = field(default_factory=list)
    listeners: list[Callable[[CallRecord], None]] = field(default_factory=list)


class AgentRuntime:
    """Model calls for every agent of one process, through the per-call runtime."""

    def __init__(
        self,
        *,
        planner: CallPlanner,
        waiter: CapacityWaiter,
        selection: SelectionPlanner,
        pool: ChatPool,
        clock: Clock,
        after_call: AfterCall | None = None,
        board: UseBoard | None = None,
        limits: ToolLoopLimits | None = None,
    ) -> None:
        self.planner = planner
        self.waiter = waiter
        self.selection = selection
        self.pool = pool
        self.clock = clock
        self.limits = limits or ToolLoopLimits()
        self._after_call = after_call
        self._board = board
        self._estimators: dict[str, TokenEstimator] = {}
        self._books = _Books()
        self._serial = 0

    # -- books -----------------------------------------------------------------------

    @property
    def records(self) -> list[CallRecord]:
        """Every call made so far, in the order they finished."""
        return list(self._books.records)

    def on_record(self, listener: Callable[[CallRecord], None]) -> None:
        self._books.listeners.append(listener)

    def estimator(self, model: str) -> TokenEstimator:
        """The token estimator of one model (tokenizers differ between models)."""
        return self._estimators.setdefault(model, TokenEstimator())

    def _holder(self, agent: str, thread_id: str, phase: str) -> str:
        self._serial += 1
        return f"{agent}@{thread_id}#{phase}-{self._serial}"

    # -- the call --------------------------------------------------------------------

    async def call(
        self,
        *,
        agent: str,
        thread_id: str,
        phase: str,
        messages: Sequence[Mapping[str, Any]],
        candidates: Sequence[Candidate],
        tools: Sequence[Tool] = (),
        wait: bool,
        done: asyncio.Event | None = None,
        sink: SignalSink | None = None,
        static: StaticTarget | None = None,
        fallbacks: Sequence[Candidate] = (),
        held_plan: bool = False,
        settings: CallSettings | None = None,
    ) -> CallOutcome:
        """Place one call, run it, release it; never raises for capacity or engine
        trouble (the outcome says what happened)."""
        specs = [t.spec() for t in tools]
        prompt_tokens = self.estimator(candidates[0].model).estimate_prompt(messages, specs)
        started = self.clock.now()
        placement: Placement | None = None
        if held_plan:
            placement = await self.selection.take(agent, thread_id, prompt_tokens=prompt_tokens)
        if placement is None:
            placement = await self._place(
                agent, thread_id, phase, candidates, prompt_tokens, wait=wait, done=done,
                sink=sink, static=static, fallbacks=fallbacks,
            )
        if not placement.placed:
            return self._refused(placement, candidates)
        outcome = await self._run(
            agent, thread_id, phase, placement, messages, tools, settings, started,
            prompt_tokens,
        )
        if not _refused_before_sending(outcome) or placement.provider is None:
            return outcome
        # DESIGN §5: a connection refused before any byte left is tried once more, and
        # elsewhere. The refused provider's ticket is back and its circuit has seen the
        # fault (``_run`` released it); it is left out of this placement altogether.
        log.info("%s: %s refused the connection; placing the call once more elsewhere",
                 agent, placement.provider)
        again = await self._place(
            agent, thread_id, phase, candidates, prompt_tokens, wait=wait, done=done,
            sink=sink, static=None, fallbacks=fallbacks, exclude=(placement.provider,),
        )
        if not again.placed:
            return self._refused(again, candidates)
        return await self._run(
            agent, thread_id, phase, again, messages, tools, settings, started,
            prompt_tokens,
        )

    async def _place(
        self,
        agent: str,
        thread_id: str,
        phase: str,
        candidates: Sequence[Candidate],
        prompt_tokens: int,
        *,
        wait: bool,
        done: asyncio.Event | None,
        sink: SignalSink | None,
        static: StaticTarget | None,
        fallbacks: Sequence[Candidate],
        exclude: Sequence[str] = (),
    ) -> Placement:
        """Place through the capacity waiter, or at once for a call that cannot wait."""
        if wait:
            signals = (
                SignalWaitSink(sink, agent=agent, thread_id=thread_id, phase=phase,
                               clock=self.clock)
                if sink is not None else None
            )
            return await self.waiter.place(
                candidates, agent=agent, holder_id=self._holder(agent, thread_id, phase),
                prompt_tokens=prompt_tokens, signals=signals, done=done, exclude=exclude,
            )
        return await self._place_now(
            agent, thread_id, phase, candidates, prompt_tokens, static, fallbacks,
            exclude=exclude,
        )

    async def _place_now(
        self,
        agent: str,
        thread_id: str,
        phase: str,
        candidates: Sequence[Candidate],
        prompt_tokens: int,
        static: StaticTarget | None,
        fallbacks: Sequence[Candidate],
        *,
        exclude: Sequence[str] = (),
    ) -> Placement:
        """A placement for a call that must not wait for capacity.

        In order: the candidates as usual (sharing a warm copy when queueing there is
        the cheapest option); then each fallback model on its own; then the static
        endpoint, but only where it already holds the model and its context holds the
        prompt. A static call bypasses the VRAM tickets, so sending one that makes the
        engine load a model would let it overrule the budget (evict on its own).
        """
        holder = self._holder(agent, thread_id, phase)
        first: Placement | None = None
        for group in (list(candidates), *([c] for c in fallbacks)):
            placement = await self.planner.place(
                group, holder_id=holder, prompt_tokens=prompt_tokens, exclude=exclude
            )
            first = first or placement
            if placement.placed:
                return placement
            if placement.action is Action.QUEUE:
                # Sharing a warm copy spends no memory; hold a ticket so the copy counts
                # as busy (never an eviction victim) while this call is in line there.
                claimed = await self.planner.take_queue(
                    placement, holder, prompt_tokens=prompt_tokens
                )
                if claimed.placed:
                    return claimed
        assert first is not None
        if first.action is Action.REFUSE:
            return first
        if static is not None:
            held = await self._static_placement(static, holder, prompt_tokens)
            if held is not None:
                return held
        return replace(first, action=Action.WAIT, reason=Reason.GPU_BUSY.value, ticket=None)

    async def _static_placement(
        self, static: StaticTarget, holder: str, prompt_tokens: int
    ) -> Placement | None:
        """The static endpoint, when it can take the call without loading anything and
        without cutting the prompt.

        Its copy is held by a zero-footprint ticket for the length of the call: resident
        is not enough, since a copy another call's ticket plans to unload may be gone by
        the time this call reaches the engine, which would load it again and push out
        whatever the planner put there (an eviction no ticket budgeted).
        """
        if static.context_length is not None and prompt_tokens > static.context_length:
            return None
        ticket = None
        fleet = await self.planner.view.snapshot()
        if fleet.providers:  # with no shared state the static endpoint is all there is
            ticket = await self.planner.hold_copy(
                static.provider, static.model, holder, prompt_tokens=prompt_tokens)
            if ticket is None:
                return None
        return Placement(
            Action.STATIC, provider=static.provider, endpoint=static.endpoint,
            model=static.model, reason="no GPU free now; the call cannot wait",
            context_length=static.context_length, ticket=ticket,
        )

    async def _finish(
        self, placement: Placement, result: ToolLoopResult | None, began: float
    ) -> None:
        """Release the ticket and tell the circuit what the call says about the provider.

        A release that fails is logged and counted, never raised: the engine may have
        answered, and the ticket's TTL reclaims the memory anyway (DESIGN §5).
        """
        # only a clean answer's duration is a latency sample: a loop that stopped early
        # (or waited on failing tools) says little about how fast the engine is
        seconds = self.clock.now() - began if result is not None and result.ok else None
        try:
            await self.planner.finish(placement, seconds=seconds, ok=_verdict(result))
        except StoreError as error:
            ticket = placement.ticket.ticket_id if placement.ticket is not None else "-"
            metrics.survived("agent", "release", metrics.STORE,
                             f"releasing ticket {ticket} ({placement.model} on "
                             f"{placement.provider}) failed; its TTL will reclaim it",
                             error, logger=log)

    @staticmethod
    def _refused(placement: Placement, candidates: Sequence[Candidate]) -> CallOutcome:
        reason = placement.reason or Reason.GPU_BUSY.value
        model = candidates[0].model
        if reason == Reason.PROMPT_TOO_LARGE.value:
            model = placement.model or model
        return CallOutcome(placement=placement, refusal=reason, model=model)

    async def _run(
        self,
        agent: str,
        thread_id: str,
        phase: str,
        placement: Placement,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Tool],
        settings: CallSettings | None,
        started: float,
        prompt_tokens: int,
    ) -> CallOutcome:
        assert placement.provider is not None and placement.endpoint is not None
        assert placement.model is not None
        chat = self.pool.get(
            provider=placement.provider, endpoint=placement.endpoint,
            model=placement.model, settings=settings,
        )
        began = self.clock.now()
        result: ToolLoopResult | None = None
        try:
            async with self.planner.lease(placement):  # renewed while the call runs
                result = await run_tool_loop(
                    chat, messages, context_length=placement.context_length,
                    estimator=self.estimator(placement.model), tools=tools, limits=self.limits,
                )
        finally:
            try:
                if self._after_call is not None:
                    try:
                        await self._after_call(placement.provider)
                    except (StoreError, OSError) as error:
                        kind = (metrics.STORE if isinstance(error, StoreError)
                                else metrics.PROVIDER)
                        metrics.survived("agent", "after-call", kind,
                                         f"reporting the state of {placement.provider} "
                                         "after a call failed", error, logger=log)
            finally:
                # The release must happen even when the call is cancelled during the
                # probe above or during the release's own compare-and-set: the shield
                # lets the release finish while the cancellation goes on upward.
                await asyncio.shield(self._finish(placement, result, began))
            if self._board is not None and result is not None:
                try:
                    await self._board.record_use(placement.model)
                except StoreError as error:
                    metrics.survived("agent", "record-use", metrics.STORE,
                                     f"recording the use of {placement.model} failed",
                                     error, logger=log)
        outcome = CallOutcome(placement=placement, result=result, model=placement.model)
        failure = result.failure
        record = CallRecord(
            thread_id=thread_id, agent=agent, phase=phase, model=placement.model,
            provider=placement.provider, endpoint=placement.endpoint,
            action=placement.action.value, waited_seconds=placement.waited_seconds,
            evicted=placement.evicted, started_at=started,
            seconds=self.clock.now() - started, ok=result.ok,
            prompt_tokens=result.last_prompt_tokens or prompt_tokens,
            model_calls=result.model_calls,
            failure_type=failure.failure_type.value if failure is not None else None,
            decision=call_decision(placement),
        )
        outcome.record = record
        self._books.records.append(record)
        for listener in self._books.listeners:
            listener(record)
        return outcome


def _refused_before_sending(outcome: CallOutcome) -> bool:
    """Whether the call's only request was refused before any byte of it left.

    Then no engine saw it and no tool ran, so placing it again repeats nothing. A
    static placement is not retried: it is already the last resort, with no elsewhere.
    """
    result, placement = outcome.result, outcome.placement
    return (
        result is not None and result.failure is not None and result.failure.never_sent
        and result.model_calls == 0 and result.tool_calls == 0
        and placement is not None and placement.action is not Action.STATIC
    )


def _verdict(result: ToolLoopResult | None) -> bool | None:
    """What a finished call says about its provider (for the circuit breaker).

    A provider fault is a failure; any other end the engine took part in (an answer, a
    tool that kept failing, a prompt that outgrew the context) is a success, since the
    engine did its part; a call that never reached it, or was cancelled, says nothing.
    """
    if result is None:
        return None
    if result.failure is not None and result.failure.provider_fault:
        return False
    return True if result.model_calls else None

