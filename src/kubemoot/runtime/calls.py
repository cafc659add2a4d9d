"""One call, one lifecycle: the runtime service every inference call goes through.

A call's life is the same whoever makes it — an agent's tool loop, a gateway request,
a simulated call in virtual time (DESIGN §10):

1. **place** it: through the capacity waiter, for at most its wait budget or until its
   ``done`` event (the discussion ended, the client left); a caller that cannot wait
   brings its own placer (the agent's static fallback, a plan held since selection);
2. **lease** its ticket: renewed every TTL/3 for as long as the call runs, so a call
   longer than the TTL keeps its memory;
3. **send** it (the caller's part: the tool loop, the HTTP forward, the emulated GPU),
   noting the engine's first byte — *wait* is arrival → that byte, load included;
4. if the provider refused the connection before any byte left, place it **once more,
   elsewhere** (that provider excluded) — nothing else is ever retried;
5. **close** it: the after-load check (re-probe a provider whose memory the call
   changed), the verdict for the circuit and the latency average, the model's recent
   use, the release (shielded from cancellation; a failed release is logged and tried
   again in the background until the store answers or the TTL reclaims the ticket),
   and the **call record** with its decision.

A call that is not placed raises :class:`CallRefused` carrying a typed
:mod:`~kubemoot.runtime.refusals` value; the edges turn it into HTTP or a sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol, TypeVar

from kubemoot import metrics
from kubemoot.clock import Clock
from kubemoot.frozen import quick_init
from kubemoot.runtime import options
from kubemoot.runtime.placement import Action, CallPlacement, CandidateModel
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.record import call_decision
from kubemoot.runtime.refusals import GpuBusy, Refusal, StateStale
from kubemoot.runtime.tokens import TokenEstimator
from kubemoot.runtime.waiting import CapacityWaiter, WaitSignals
from kubemoot.store.documents import TicketState
from kubemoot.store.protocol import StoreError

__all__ = [
    "ActiveCall",
    "AfterLoad",
    "CallAbandoned",
    "CallRecord",
    "CallRefused",
    "CallRequest",
    "CallService",
    "Placer",
    "RefusedBeforeSending",
    "UseBoard",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

AfterLoad = Callable[[str], Awaitable[None]]
"""``after_load(provider)``: re-probe a provider whose memory a call changed."""

Placer = Callable[[str, Collection[str]], Awaitable[CallPlacement]]
"""``placer(holder_id, exclude)``: a caller's own way to place (no waiting)."""

# Actions after which the provider holds a copy the published state does not show yet.
_CHANGES_MEMORY = frozenset({Action.COLD_LOAD, Action.UNLOAD, Action.LOADING})


class UseBoard(Protocol):
    """The part of the DemandBoard a finished call writes (recent use)."""

    async def record_use(self, model: str) -> None: ...


@quick_init
@dataclass(frozen=True, slots=True)
class CallRequest:
    """What a caller asks for: candidates, who asks, the prompt, how long it may wait.

    ``budget``: seconds the call may wait for capacity (None: the waiter's limit);
    ``done``: an event that ends the wait (and, with ``abandon_when_done``, abandons a
    call placed just as it was set: a client that went away).
    """

    candidates: tuple[CandidateModel, ...]
    agent: str
    thread_id: str
    phase: str
    prompt_tokens: int | None = None
    budget: float | None = None
    done: asyncio.Event | None = None
    abandon_when_done: bool = False
    signals: WaitSignals | None = None
    ticket_state: TicketState = TicketState.RUNNING
    holder: str | None = None  # the ticket holder's id (default: one made per attempt)

    @property
    def model(self) -> str:
        return self.candidates[0].model


@dataclass(frozen=True, slots=True)
class CallRecord:
    """Per-call attribution: where one call really ran, how long it waited, and why.

    ``waited_seconds`` runs from the call's arrival to the start of inference (the
    engine's first byte), a load included; ``placement_seconds`` is the part until the
    call held its ticket (deciding, claiming, and any time in the waiter's line).
    """

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
    placement_seconds: float = 0.0
    #: the placement this call ran on; its decision is summarised only when asked for
    placement: CallPlacement | None = field(default=None, compare=False, repr=False)
    #: the summary a record read back from the wire carries (it has no placement)
    summary: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def decision(self) -> dict[str, Any] | None:
        """The per-call decision record, bounded (runtime.record.call_decision)."""
        if self.placement is not None:
            return call_decision(self.placement)
        return dict(self.summary) if self.summary is not None else None

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
            "placementSeconds": round(self.placement_seconds, 3),
            "evicted": list(self.evicted),
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "promptTokens": self.prompt_tokens,
            "modelCalls": self.model_calls,
            "reason": self.reason,
            "failureType": self.failure_type,
            "decision": self.decision,
        }


class CallRefused(Exception):
    """The call was not placed; ``refusal`` says why, with its facts."""

    def __init__(self, refusal: Refusal, placement: CallPlacement, *, model: str) -> None:
        super().__init__(refusal.reason.value)
        self.refusal = refusal
        self.placement = placement
        self.model = model  # the model concerned (the preferred one, or the placed one)


class CallAbandoned(Exception):
    """The caller went away (``done`` set) while its call waited; nothing is held."""


class RefusedBeforeSending(Exception):
    """Raised by a call's *send*: the provider refused the connection before any byte
    of the request left. The service places the call once more elsewhere; a second
    refusal is raised to the caller with ``call`` (closed) and ``value`` (whatever the
    send had to say, e.g. the tool loop's result)."""

    def __init__(self, provider: str, message: str, value: object = None) -> None:
        super().__init__(message)
        self.provider = provider
        self.message = message
        self.value = value
        self.call: ActiveCall | None = None


#: How long a placement round may outlive the end of its call's wait before it is cut.
_ROUND_OVERRUN_SECONDS = 0.5


class _WaitEnds:
    """The waiter's signals for one call: when the call joins a line, a task starts
    that ends the wait at the budget or when the caller's ``done`` is set. A call
    placed at once — the common case — starts no task."""

    def __init__(self, clock: Clock, budget: float | None, stop: asyncio.Event | None,
                 forward: WaitSignals | None) -> None:
        self._clock = clock
        self._budget = budget
        self._stop = stop
        self._forward = forward
        self.done = asyncio.Event()
        self.joined = False
        #: The wait was cut because a placement round outlived the end of the wait.
        self.cut = False
        self._task: asyncio.Future[None] | None = None
        #: the caller's task, placing the call: known once the call joins a line (the
        #: waiter says so from that task), so a call placed at once never asks
        self._placing: asyncio.Task[Any] | None = None
        if (stop is not None and stop.is_set()) or (budget is not None and budget <= 0):
            self.done.set()  # nothing to wait for: a busy answer is final at once

    async def waiting(self, *, model: str, reason: str) -> None:
        self.joined = True
        self._placing = asyncio.current_task()
        if self._budget is not None or self._stop is not None:
            self._task = asyncio.ensure_future(self._end())
        if self._forward is not None:
            await self._forward.waiting(model=model, reason=reason)

    async def evaluating(self, *, model: str, provider: str) -> None:
        if self._forward is not None:
            await self._forward.evaluating(model=model, provider=provider)

    async def _end(self) -> None:
        ends: set[asyncio.Future[Any]] = set()
        if self._stop is not None:
            ends.add(asyncio.ensure_future(self._stop.wait()))
        if self._budget is not None:
            ends.add(asyncio.ensure_future(self._clock.sleep(self._budget)))
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for end in ends:
                end.cancel()
        self.done.set()
        # The waiter sees ``done`` between its rounds. A round blocked on a store that
        # does not answer would overrun the budget by a store timeout per operation,
        # so one still running a moment after the end is cut.
        await self._clock.sleep(_ROUND_OVERRUN_SECONDS)
        if self._placing is not None and not self._placing.done():
            self.cut = True
            self._placing.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _resolve(ended: asyncio.Future[None], _release: object) -> None:
    if not ended.done():  # a caller cancelled meanwhile no longer waits
        ended.set_result(None)


class ActiveCall:
    """A placed call: holds its ticket (leased) until :meth:`close`, once."""

    def __init__(self, service: CallService, request: CallRequest, placement: CallPlacement, *,
                 holder: str, arrived: float, action: str) -> None:
        self.service = service
        self.request = request
        self.placement = placement
        self.holder = holder
        self.arrived = arrived
        self.action = action
        self.placed_at = service.clock.now()
        self.inference_started: float | None = None
        self.ok: bool | None = None  # the verdict; None: it says nothing of the provider
        self.succeeded: bool | None = None  # the call's own success (None: the verdict)
        self.model_calls = 0
        self.prompt_tokens = request.prompt_tokens
        self.failure_type: str | None = None
        self.record: CallRecord | None = None
        # The lease's context, entered by the service and left when the call closes (held
        # as is: an exit stack per call cost more than the one exit it would hold).
        self._lease: contextlib.AbstractAsyncContextManager[object] | None = None
        self._closed = False

    @property
    def provider(self) -> str:
        assert self.placement.provider is not None
        return self.placement.provider

    @property
    def model(self) -> str:
        assert self.placement.model is not None
        return self.placement.model

    @property
    def placement_seconds(self) -> float:
        return self.placed_at - self.arrived

    @property
    def waited_seconds(self) -> float:
        """Arrival → start of inference (now, while the engine has not started)."""
        end = self.inference_started
        return (end if end is not None else self.service.clock.now()) - self.arrived

    def first_byte(self, *, at: float | None = None) -> None:
        """The engine started answering (its first byte; ``at``: when, if earlier than
        now, as an engine's own durations tell): the wait ends here, a load included."""
        if self.inference_started is None:
            now = self.service.clock.now()
            self.inference_started = now if at is None else max(self.placed_at, min(at, now))

    def note(self, *, ok: bool | None = None, succeeded: bool | None = None,
             model_calls: int | None = None, prompt_tokens: int | None = None,
             failure_type: str | None = None) -> None:
        """What the send learnt: the verdict on the provider, whether the call itself
        succeeded (a tool loop may fail with a healthy engine), engine requests, the
        engine's prompt size, the failure."""
        if ok is not None:
            self.ok = ok
        if succeeded is not None:
            self.succeeded = succeeded
        if model_calls is not None:
            self.model_calls = model_calls
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if failure_type is not None:
            self.failure_type = failure_type

    async def _enter_lease(self) -> None:
        lease = self.service.planner.lease(self.placement)
        await lease.__aenter__()
        self._lease = lease

    async def _leave_lease(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.__aexit__(None, None, None)

    async def close(self, *, ok: bool | None = None) -> CallRecord | None:
        """Stop the lease, re-probe after a load, learn, record use, release; once.

        ``ok`` (or the noted verdict): True for an answer, False for a provider fault,
        None when the call says nothing of the provider (the client left, cancelled).
        """
        if ok is not None:
            self.ok = ok
        if self._closed:
            return self.record
        self._closed = True
        try:
            await self.service._before_release(self)
        finally:
            # The release must happen even when the call is cancelled during the probe
            # or during the release's own compare-and-set: the shield lets it finish
            # while the cancellation goes on upward.
            # The shield spelt out (the release's task, and a future of the caller's
            # that the release's end resolves): asyncio.shield and ensure_future cost
            # about ten Python calls per call, this two.
            loop = self.service.loop()
            release = loop.create_task(self.service._release(self))
            ended: asyncio.Future[None] = loop.create_future()
            release.add_done_callback(partial(_resolve, ended))
            try:
                await ended
            except asyncio.CancelledError:
                release.add_done_callback(lambda _done: self.service._recorded(self))
                raise
            release.result()  # what the release raised, the caller gets, as through a shield
        # Recorded in the caller's own task: a listener may tie the record to the
        # requests that task made (the demo's inference starts do).
        self.service._recorded(self)
        return self.record

    async def __aenter__(self) -> ActiveCall:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        await self.close(ok=self.ok if kind is None else None)


@dataclass(slots=True)
class CallService:
    """Places, leases, retries, releases and records the calls of one process."""

    planner: CallPlanner
    waiter: CapacityWaiter
    clock: Clock
    board: UseBoard | None = None
    after_load: AfterLoad | None = None
    #: Names this process in every holder and thread id, so two replicas never collide.
    identity: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    #: Seconds a busy refusal says to retry in when nothing in flight gives an estimate.
    idle_retry_seconds: float = 5.0
    listeners: list[Callable[[CallRecord], None]] = field(default_factory=list)
    in_flight: set[ActiveCall] = field(default_factory=set)
    _estimators: dict[str, TokenEstimator] = field(default_factory=dict)
    _serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _drained: asyncio.Event = field(default_factory=asyncio.Event)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the calls run on, asked for once: on Python 3.11 each
        ``asyncio.get_running_loop()`` makes a system call (getpid), and a gateway asks
        on every call. Asked again once that loop has closed (a service used on a later
        loop, as tests do)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def on_record(self, listener: Callable[[CallRecord], None]) -> None:
        self.listeners.append(listener)

    async def close_all(self, *, within: float = 10.0) -> None:
        """Close every call still open (a shutdown), and wait up to ``within`` seconds
        for the releases under way, so the store is not closed under them."""
        for call in list(self.in_flight):
            await call.close(ok=None)
        if self.in_flight:
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                await self.clock.wait_for(self._drained.wait(), within)

    def estimator(self, model: str) -> TokenEstimator:
        """The token estimator of one model (tokenizers differ between models)."""
        estimator = self._estimators.get(model)
        if estimator is None:  # made once per model, not once per call
            estimator = self._estimators[model] = TokenEstimator()
        return estimator

    def estimate(self, model: str, messages: Sequence[object],
                 tools: Sequence[Mapping[str, Any]] | None = None) -> int:
        """The prompt's tokens as the model's estimator reckons them (never raises for
        a malformed message: it counts what text there is)."""
        # a list of dicts (every gateway call's) is counted as it is: an ``isinstance``
        # of the ``Mapping`` ABC per message runs Python, and the copy it made was one
        # more list per call
        listed = messages
        for message in messages:
            if type(message) is not dict:
                listed = [m if isinstance(m, Mapping) else {"content": m} for m in messages]
                break
        return self.estimator(model).estimate_prompt(listed, tools)

    def holder_id(self, agent: str, thread_id: str, phase: str) -> str:
        """A ticket holder unique to this process (its identity) and this call."""
        return f"{agent}@{thread_id}#{phase}-{self.identity}-{next(self._serial)}"

    def thread_id(self, caller: str) -> str:
        """A fresh thread id for a call that has none (a gateway request)."""
        return f"{caller}@{self.identity}#{next(self._serial)}"

    # -- placing ---------------------------------------------------------------------

    async def place(self, request: CallRequest, *, exclude: Collection[str] = (),
                    placer: Placer | None = None, arrived: float | None = None) -> ActiveCall:
        """A leased call, or :class:`CallRefused` / :class:`CallAbandoned`."""
        arrived = self.clock.now() if arrived is None else arrived
        holder = request.holder or self.holder_id(request.agent, request.thread_id,
                                                   request.phase)
        ends = _WaitEnds(self.clock, request.budget, request.done, request.signals)
        try:
            if placer is not None:
                placement = await placer(holder, exclude)
            else:
                # a call with neither a budget nor a stop event waits the waiter's way,
                # with no task of its own to end the wait
                bounded = request.budget is not None or request.done is not None
                placement = await self.waiter.place(
                    request.candidates, agent=request.agent, holder_id=holder,
                    prompt_tokens=request.prompt_tokens, signals=ends,
                    done=ends.done if bounded else None,
                    ticket_state=request.ticket_state, exclude=exclude)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not ends.cut or task is None or task.uncancel() > 0:
                raise  # cancelled by someone else too: that cancellation stands
            raise StoreError("placing the call outlived its wait budget: the shared "
                             "store does not answer") from None
        finally:
            if ends.joined:  # only a call that joined a line can have a task to end
                await ends.close()
        if request.abandon_when_done and request.done is not None and request.done.is_set():
            if placement.placed:
                await self.planner.release(placement)
            raise CallAbandoned("the caller went away while its call waited")
        if not placement.placed:
            raise await self._refused(request, placement, arrived)
        action = str(placement.action)  # its value, without the enum's Python descriptor
        if ends.joined and placement.action in (Action.WARM, Action.LOADING):
            action = Action.QUEUE.value  # it waited in line for a slot of a copy
        call = ActiveCall(self, request, placement, holder=holder, arrived=arrived,
                          action=action)
        self.in_flight.add(call)
        try:
            await call._enter_lease()
        except BaseException:
            await call.close(ok=None)
            raise
        return call

    async def _refused(self, request: CallRequest, placement: CallPlacement,
                       arrived: float) -> CallRefused:
        refusal = placement.refusal or GpuBusy()
        model = request.model
        if isinstance(refusal, GpuBusy):
            refusal = GpuBusy(waited=self.clock.now() - arrived,
                              start_estimate=await self._start_estimate(request))
        elif isinstance(refusal, StateStale):  # the ages as of the answer
            now = self.clock.now()
            refusal = replace(refusal, at=now, waited=now - arrived)
        elif placement.model is not None:
            model = placement.model
        return CallRefused(refusal, replace(placement, refusal=refusal), model=model)

    async def _start_estimate(self, request: CallRequest) -> float | None:
        """Seconds until the call could probably start, priced afresh now: the wait's
        last options may name an unload plan that was never claimable; what counts is
        when work in flight ends."""
        try:
            rnd = await self.planner.new_round(request.prompt_tokens)
        except StoreError:
            return None
        models = [c.model for c in self.planner.in_tolerance(request.candidates)]
        return options.start_estimate(rnd, models)

    def retry_after(self, refusal: GpuBusy) -> int:
        """Whole seconds a busy caller should wait before trying again (at least 1)."""
        estimate = refusal.start_estimate
        if estimate is None:
            estimate = self.idle_retry_seconds  # nothing in flight: the next probe is news
        return max(1, int(-(-estimate // 1)))

    async def start(self, request: CallRequest, send: Callable[[ActiveCall], Awaitable[T]],
                    *, placer: Placer | None = None) -> tuple[ActiveCall, T]:
        """Place the call and ``send`` it; once more elsewhere if the provider refused
        the connection before any byte left (DESIGN §5). The call stays open: the
        caller closes it (or uses it as an async context manager)."""
        arrived = self.clock.now()
        exclude: tuple[str, ...] = ()
        while True:
            call = await self.place(request, exclude=exclude, placer=placer, arrived=arrived)
            try:
                value = await send(call)
            except RefusedBeforeSending as refused:
                await call.close(ok=False)  # the circuit counts the refused connection
                if exclude or call.placement.action is Action.STATIC:
                    refused.call = call  # once only: a static call has no elsewhere
                    raise
                log.info("%s: %s refused the connection; placing the call once more "
                         "elsewhere", request.agent, refused.provider)
                exclude = (refused.provider,)
                continue
            except BaseException:
                await call.close(ok=None)
                raise
            return call, value

    # -- closing ---------------------------------------------------------------------

    async def _before_release(self, call: ActiveCall) -> None:
        """Stop renewing the lease; re-probe a provider whose memory the call changed,
        so the next placement sees the copy it loaded."""
        p = call.placement
        await call._leave_lease()
        if p.action in _CHANGES_MEMORY and self.after_load is not None:
            try:
                await self.after_load(call.provider)
            except (StoreError, OSError) as error:
                kind = metrics.STORE if isinstance(error, StoreError) else metrics.PROVIDER
                metrics.survived("runtime", "after-load", kind, f"re-probing "
                                 f"{call.provider} after a load failed", error, logger=log)

    async def _release(self, call: ActiveCall) -> None:
        p = call.placement
        try:
            await self._finish(call)
            if call.ok is not None and p.model is not None and self.board is not None:
                try:
                    await self.board.record_use(p.model)
                except StoreError as error:
                    metrics.survived("runtime", "record-use", metrics.STORE,
                                     f"recording the use of {p.model} failed", error,
                                     logger=log)
        finally:
            self.in_flight.discard(call)
            if not self.in_flight:
                self._drained.set()

    def _recorded(self, call: ActiveCall) -> None:
        """Build the call's record and tell the listeners (once the ticket is back);
        with nobody listening (the simulator keeps its own books) there is no record."""
        if call.record is not None or not self.listeners:
            return
        call.record = self._record(call)
        for listener in self.listeners:
            try:
                listener(call.record)
            except Exception:  # attribution must never fail a call
                log.exception("call listener failed")

    async def _finish(self, call: ActiveCall) -> None:
        """Learn from the call and release its ticket; a release that fails is logged
        and counted, never raised (the engine may have answered; the TTL reclaims)."""
        p = call.placement
        # only a clean answer's duration is a latency sample, and only its inference:
        # the load before it is priced by the load rate, not by the latency average
        began = call.inference_started if call.inference_started is not None else call.placed_at
        seconds = self.clock.now() - began if call.ok else None
        try:
            await self.planner.finish(p, seconds=seconds, ok=call.ok)
        except (StoreError, OSError) as error:
            # the ticket manager tries it again in the background (TicketManager.release)
            metrics.survived("runtime", "release", metrics.STORE,
                             f"releasing the ticket of {call.holder} ({p.model} on "
                             f"{p.provider}) failed; tried again until the store answers "
                             "or its TTL reclaims it", error, logger=log)

    def _record(self, call: ActiveCall) -> CallRecord:
        p, request, now = call.placement, call.request, self.clock.now()
        return CallRecord(
            thread_id=request.thread_id, agent=request.agent, phase=request.phase,
            model=p.model, provider=p.provider, endpoint=p.endpoint, action=call.action,
            waited_seconds=call.waited_seconds, evicted=p.evicted, started_at=call.arrived,
            seconds=now - call.arrived,
            ok=call.succeeded if call.succeeded is not None else bool(call.ok),
            prompt_tokens=call.prompt_tokens,
            model_calls=call.model_calls, failure_type=call.failure_type,
            placement_seconds=call.placement_seconds, placement=p,
        )
