"""The agent runtime: one inference call, placed at the moment it is needed.

:meth:`AgentRuntime.call` is the path every model call of an agent takes. Its
lifecycle — estimate, place through the waiter, lease, after-load check, retry once
elsewhere after a refused connection, verdict, recent use, release, the call record —
is the runtime's :class:`~kubemoot.runtime.calls.CallService`, the same one the gateway
and the simulator use. What is the agent's own stays here:

* the placement of a call that cannot wait (triage, the coordinator's synthesis):
  a mulling call first takes the plan held for it since selection; calls that cannot
  wait place once, share a warm copy when the only option is to queue at it, and
  otherwise fall back to a static endpoint only when that endpoint's context holds the
  prompt;
* the tool loop, run on the chat the pool holds for the placed provider and model,
  with the context of *that* provider;
* the outcome: the loop's result, or the typed refusal it never ran for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kubemoot.agent.pool import CallSettings, ChatPool
from kubemoot.agent.signals import Signal, SignalMetadata, SignalSink, SignalType
from kubemoot.agent.toolloop import Tool, ToolLoopLimits, ToolLoopResult, run_tool_loop
from kubemoot.clock import Clock
from kubemoot.providers.protocol import ChatResult
from kubemoot.runtime.calls import (
    ActiveCall,
    AfterLoad,
    CallRecord,
    CallRefused,
    CallRequest,
    CallService,
    RefusedBeforeSending,
)
from kubemoot.runtime.held_plans import HeldPlans
from kubemoot.runtime.placement import Action, CallPlacement, CandidateModel
from kubemoot.runtime.refusals import GpuBusy, Refusal
from kubemoot.runtime.tokens import TokenEstimator

__all__ = [
    "AfterCall",
    "AgentRuntime",
    "CallOutcome",
    "CallRecord",
    "SignalWaitSink",
    "StaticTarget",
]

log = logging.getLogger(__name__)

AfterCall = AfterLoad
"""``after_call(provider)``: re-probes a provider after a call changed its memory."""


@dataclass(frozen=True, slots=True)
class StaticTarget:
    """The endpoint the operator bound, for calls that cannot wait (spec: static)."""

    provider: str
    endpoint: str
    model: str
    context_length: int | None = None


@dataclass(slots=True)
class CallOutcome:
    """What one call came to: a loop result, or the refusal it never ran for."""

    placement: CallPlacement | None = None
    result: ToolLoopResult | None = None
    refused: Refusal | None = None  # typed, with its facts
    record: CallRecord | None = None
    model: str | None = None  # the model concerned (placed, or refused)

    @property
    def ran(self) -> bool:
        return self.result is not None

    @property
    def refusal(self) -> str | None:
        """The refusal's wire name (``metadata.reason``): gpu-busy, model-too-large, ..."""
        return self.refused.reason.value if self.refused is not None else None

    def metadata(self) -> SignalMetadata:
        """Attribution for the signal this call leads to."""
        p = self.placement
        failure = self.result.failure if self.result is not None else None
        waited = self.record.waited_seconds if self.record is not None else (
            p.waited_seconds if p is not None else None)
        return SignalMetadata(
            provider=p.provider if p is not None and self.ran else None,
            model=self.model,
            evicted=p.evicted if p is not None and self.ran else (),
            reason=self.refusal,
            failure_type=failure.failure_type.value if failure is not None else None,
            failed_tool=failure.failed_tool if failure is not None else None,
            last_error=failure.last_error if failure is not None else None,
            waited_seconds=round(waited, 3) if waited is not None else None,
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


class _TimedChat:
    """The pool's chat for one call: the first reply tells the call when inference
    started (its arrival less the engine's own time on it after any load)."""

    def __init__(self, chat: Any, call: ActiveCall, clock: Clock) -> None:
        self._chat = chat
        self._call = call
        self._clock = clock

    async def chat(self, messages: Sequence[Mapping[str, Any]], *, num_ctx: int | None = None,
                   tools: Sequence[Mapping[str, Any]] | None = None) -> ChatResult:
        reply: ChatResult = await self._chat.chat(messages, num_ctx=num_ctx, tools=tools)
        if self._call.inference_started is None:
            self._call.first_byte(at=self._clock.now() - (reply.compute_seconds or 0.0))
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self._chat, name)


class AgentRuntime:
    """Model calls for every agent of one process, through the runtime's call service."""

    def __init__(
        self,
        *,
        calls: CallService,
        held_plans: HeldPlans,
        pool: ChatPool,
        limits: ToolLoopLimits | None = None,
    ) -> None:
        self.calls = calls
        self.planner = calls.planner
        self.waiter = calls.waiter
        self.held_plans = held_plans
        self.pool = pool
        self.clock = calls.clock
        self.limits = limits or ToolLoopLimits()
        self._records: list[CallRecord] = []
        calls.on_record(self._records.append)

    # -- books -----------------------------------------------------------------------

    @property
    def records(self) -> list[CallRecord]:
        """Every call made so far, in the order they finished."""
        return list(self._records)

    def on_record(self, listener: Callable[[CallRecord], None]) -> None:
        self.calls.on_record(listener)

    def estimator(self, model: str) -> TokenEstimator:
        """The token estimator of one model (tokenizers differ between models)."""
        return self.calls.estimator(model)

    # -- the call --------------------------------------------------------------------

    async def call(
        self,
        *,
        agent: str,
        thread_id: str,
        phase: str,
        messages: Sequence[Mapping[str, Any]],
        candidates: Sequence[CandidateModel],
        tools: Sequence[Tool] = (),
        wait: bool,
        done: asyncio.Event | None = None,
        sink: SignalSink | None = None,
        static: StaticTarget | None = None,
        fallbacks: Sequence[CandidateModel] = (),
        held_plan: bool = False,
        settings: CallSettings | None = None,
    ) -> CallOutcome:
        """Place one call, run it, release it; never raises for capacity or engine
        trouble (the outcome says what happened)."""
        specs = [t.spec() for t in tools]
        prompt_tokens = self.calls.estimate(candidates[0].model, messages, specs)
        signals = (SignalWaitSink(sink, agent=agent, thread_id=thread_id, phase=phase,
                                  clock=self.clock) if sink is not None else None)
        request = CallRequest(tuple(candidates), agent=agent, thread_id=thread_id,
                              phase=phase, prompt_tokens=prompt_tokens, done=done,
                              signals=signals)
        placer = self._placer(agent, thread_id, request, held_plan=held_plan, wait=wait,
                              static=static, fallbacks=fallbacks)

        async def send(call: ActiveCall) -> ToolLoopResult:
            result = await self._run_loop(call, messages, tools, settings)
            if _refused_before_sending(result):
                assert result.failure is not None
                raise RefusedBeforeSending(call.provider, result.failure.last_error or "",
                                           value=result)
            return result

        try:
            call, result = await self.calls.start(request, send, placer=placer)
        except CallRefused as refused:
            return CallOutcome(placement=refused.placement, refused=refused.refusal,
                               model=refused.model)
        except RefusedBeforeSending as refused:  # the second refusal: the answer
            assert refused.call is not None and isinstance(refused.value, ToolLoopResult)
            return CallOutcome(placement=refused.call.placement, result=refused.value,
                               record=refused.call.record, model=refused.call.model)
        async with call:
            pass  # the loop ran in send; leaving the block closes the call
        return CallOutcome(placement=call.placement, result=result, record=call.record,
                           model=call.model)

    def _placer(
        self, agent: str, thread_id: str, request: CallRequest, *, held_plan: bool,
        wait: bool, static: StaticTarget | None, fallbacks: Sequence[CandidateModel],
    ) -> Callable[[str, Collection[str]], Any] | None:
        """The agent's own way to place, or None for the service's waiter."""
        first_try = [held_plan]

        async def place(holder: str, exclude: Collection[str]) -> CallPlacement:
            if first_try[0]:
                first_try[0] = False
                held = await self.held_plans.take(agent, thread_id,
                                                 prompt_tokens=request.prompt_tokens)
                if held is not None:
                    return held
            if wait:
                return await self.waiter.place(
                    request.candidates, agent=agent, holder_id=holder,
                    prompt_tokens=request.prompt_tokens, signals=request.signals,
                    done=request.done, exclude=exclude)
            return await self._place_now(holder, request, static if not exclude else None,
                                         fallbacks, exclude=exclude)

        return place if held_plan or not wait else None

    async def _place_now(
        self,
        holder: str,
        request: CallRequest,
        static: StaticTarget | None,
        fallbacks: Sequence[CandidateModel],
        *,
        exclude: Collection[str] = (),
    ) -> CallPlacement:
        """A placement for a call that must not wait for capacity.

        In order: the candidates as usual (sharing a warm copy when queueing there is
        the cheapest option); then each fallback model on its own; then the static
        endpoint, but only where it already holds the model and its context holds the
        prompt. A static call bypasses the VRAM tickets, so sending one that makes the
        engine load a model would let it overrule the budget (evict on its own).
        """
        prompt_tokens = request.prompt_tokens
        first: CallPlacement | None = None
        for group in (list(request.candidates), *([c] for c in fallbacks)):
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
        return replace(first, action=Action.WAIT, refusal=GpuBusy(), ticket=None)

    async def _static_placement(
        self, static: StaticTarget, holder: str, prompt_tokens: int | None
    ) -> CallPlacement | None:
        """The static endpoint, when it can take the call without loading anything and
        without cutting the prompt.

        Its copy is held by a zero-footprint ticket for the length of the call: resident
        is not enough, since a copy another call's ticket plans to unload may be gone by
        the time this call reaches the engine, which would load it again and push out
        whatever the planner put there (an eviction no ticket budgeted).
        """
        if (static.context_length is not None and prompt_tokens is not None
                and prompt_tokens > static.context_length):
            return None
        ticket = None
        fleet = await self.planner.view.snapshot()
        if fleet.providers:  # with no shared state the static endpoint is all there is
            ticket = await self.planner.hold_copy(
                static.provider, static.model, holder, prompt_tokens=prompt_tokens)
            if ticket is None:
                return None
        return CallPlacement(
            Action.STATIC, provider=static.provider, endpoint=static.endpoint,
            model=static.model, context_length=static.context_length, ticket=ticket,
        )

    async def _run_loop(
        self,
        call: ActiveCall,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Tool],
        settings: CallSettings | None,
    ) -> ToolLoopResult:
        placement = call.placement
        assert placement.endpoint is not None
        chat = self.pool.get(
            provider=call.provider, endpoint=placement.endpoint,
            model=call.model, settings=settings,
        )
        result = await run_tool_loop(
            _TimedChat(chat, call, self.clock), messages,
            context_length=placement.context_length, estimator=self.estimator(call.model),
            tools=tools, limits=self.limits,
        )
        failure = result.failure
        call.note(ok=_verdict(result), succeeded=result.ok, model_calls=result.model_calls,
                  prompt_tokens=result.last_prompt_tokens,
                  failure_type=failure.failure_type.value if failure is not None else None)
        return result


def _refused_before_sending(result: ToolLoopResult) -> bool:
    """Whether the call's only request was refused before any byte of it left.

    Then no engine saw it and no tool ran, so placing it again repeats nothing (the
    service does, once, elsewhere; a static placement has no elsewhere).
    """
    return (
        result.failure is not None and result.failure.never_sent
        and result.model_calls == 0 and result.tool_calls == 0
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
