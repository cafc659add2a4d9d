"""The ``kubemoot`` policy: the production per-call runtime, unchanged, in virtual time.

Everything here is wiring; no placement logic lives in the simulator. The runtime is
built by :func:`~kubemoot.runtime.builder.build_runtime`, the very function the agent
runtime and the gateway use (circuit breakers included), and runs on a
:class:`~kubemoot.store.memory.MemoryKV` with a :class:`~kubemoot.clock.LoopClock`,
which under the simulator's loop reads virtual time; the emulated GPUs are their
provider clients. A publisher plays the operator's prober: whenever a card's resident
set changes it writes the card's provider-state document (as ``/api/ps`` would show it).

One runtime instance serves every simulated agent, like one gateway process: tickets
still go through compare-and-set on the shared documents, and the 200 ms state cache
works in virtual time.

A call goes through the production call service (:mod:`kubemoot.runtime.calls`), the
one the agents and the gateway use: its :class:`~kubemoot.runtime.waiting.CapacityWaiter`
puts a busy call (``queue`` or ``wait``) in a first-come line, where it holds a
``wait.<model>.<agent>`` entry and places again as capacity changes, standing aside
with ``gpu-busy`` when the scenario's wait limit passes; a final refusal stands aside
at once with its reason. The view follows the buckets through watches, as a long-lived
gateway process would. Once placed, the ticket is leased; a cold load or an unload plan
waits for the model to be ready, marks its ticket running, and computes. The service
releases the ticket and records the call; what is the simulator's is virtual time.
Every request asks the engine for the runtime's ``engine_keep_alive_seconds``: the
runtime's own unload plans make room, so a copy need not expire on the client's short
timer (DESIGN §5, residency is a lease). A thread's prompt goes to the engine, whose
per-slot cache decides its prefill; the runtime's prefix book prices it per copy from
the calls it made (which copy served the thread last).

Agents are planned at selection as the agent runtime plans them (the spec's "Planning
at selection"): when a discussion selects its agents (the trace's selections), each
selected agent's :meth:`~kubemoot.runtime.held_plans.HeldPlans.commit_to_thread` runs
in turn, so agents selected together see each other's tickets and intents; it
publishes the agent's intents, places its first mulling call with the assumed prompt
size and, when that plan is a load, starts the load while triage runs. The first
mulling call takes the held plan (or places afresh when it no longer fits), exactly as
:class:`~kubemoot.agent.runtime.AgentRuntime` does. The intents are withdrawn, and an
unused plan released, once every call of the agent's thread has ended, or at once when
one of them stood aside or failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace

from kubemoot import metrics
from kubemoot.clock import LoopClock
from kubemoot.providers.protocol import ProviderClient, ProviderError, ProviderUnavailable
from kubemoot.runtime.builder import Runtime, build_runtime
from kubemoot.runtime.calls import ActiveCall, CallRefused, CallRequest, RefusedBeforeSending
from kubemoot.runtime.placement import Action, CallPlacement
from kubemoot.runtime.prefix import PrefixBook, ThreadPrompt
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import DEFAULTS, RuntimeSettings
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.metrics import FAILED, FINISHED, REFUSED, STOOD_ASIDE, SimulatedOutcome
from kubemoot.sim.phases import CURRENT_CALL
from kubemoot.sim.policies import Policy, SimContext
from kubemoot.sim.vloop import loop_clock, sleep
from kubemoot.sim.workload import CallSpec, Selection
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import Bucket

__all__ = ["KubemootPolicy"]

log = logging.getLogger(__name__)

# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read under callgrind, a module global about
# 150): the members read once or more per call are kept at module level.
_JOINED = (Action.WARM, Action.LOADING)
_LOADS = (Action.COLD_LOAD, Action.UNLOAD, Action.LOADING)


class _StatePublisher:
    """Writes a card's provider-state document after each change of its resident set."""

    def __init__(self, gpu: EmulatedGpu, bucket: Bucket, clock: LoopClock,
                 view: ProviderView) -> None:
        self._gpu = gpu
        self._bucket = bucket
        self._clock = clock
        self._view = view  # handed each document written, so that it is not parsed back
        self._scheduled = False
        gpu.on_residency_change(self.changed)

    def changed(self) -> None:
        # Coalesce the changes of one instant into one write, made right after them.
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._write_soon)

    def _write_soon(self) -> None:
        asyncio.get_running_loop().create_task(self.publish())

    async def publish(self) -> None:
        self._scheduled = False
        document = self._gpu.state_document(self._clock.now())
        revision = await self._bucket.put(encode_token(self._gpu.name), document.to_json())
        self._view.note_state_written(revision, document)


class KubemootPolicy(Policy):
    """Per-call placement by :mod:`kubemoot.runtime` (see the module docstring)."""

    name = "kubemoot"

    def __init__(self, settings: RuntimeSettings | None = None) -> None:
        self._settings = settings
        self._runtime: Runtime | None = None
        self._prefix: PrefixBook | None = None
        # Planning at selection: each selection by its first mulling call, its commit
        # (a task, awaited by that call and by the selector), and per call the
        # selection whose thread it belongs to, with the calls still to end.
        self._selection_of: dict[int, Selection] = {}
        self._first_of: dict[int, Selection] = {}
        self._commits: dict[int, asyncio.Task[None]] = {}
        self._calls_left: dict[int, int] = {}
        self._selector: asyncio.Task[None] | None = None

    @property
    def runtime(self) -> Runtime | None:
        """The production runtime this policy runs (None before :meth:`start`)."""
        return self._runtime

    async def start(self, ctx: SimContext) -> None:
        clock = loop_clock(epoch=ctx.epoch)
        clock.now()  # anchor the clock at loop time 0
        wait_limit = ctx.extras.get("gpu_wait_limit_seconds", DEFAULTS.gpu_wait_limit_seconds)
        limit = (float(wait_limit) if isinstance(wait_limit, int | float)
                 else DEFAULTS.gpu_wait_limit_seconds)
        # The scenario's wait limit holds even over explicitly given settings.
        settings = replace(self._settings or RuntimeSettings(), gpu_wait_limit_seconds=limit)
        clients: dict[str, ProviderClient] = dict(ctx.gpus)
        runtime = await build_runtime(MemoryKV(clock), clock=clock, settings=settings,
                                      clients=clients, declared=ctx.sizes, rng=ctx.rng)
        runtime.calls.identity = "sim"  # holder ids repeat from run to run
        runtime.planner.prefix = self._prefix = PrefixBook(settings.prefill_seconds_per_token)
        self._runtime = runtime
        for gpu in ctx.gpus.values():
            await _StatePublisher(gpu, runtime.states, clock, runtime.view).publish()
        await runtime.start()
        selections = ctx.trace.selections
        for selection in selections:
            self._first_of[selection.first_call] = selection
            self._calls_left[selection.first_call] = len(selection.calls)
            for call_id in selection.calls:
                self._selection_of[call_id] = selection
        if selections:
            self._selector = asyncio.get_running_loop().create_task(self._select(selections))

    async def _select(self, selections: tuple[Selection, ...]) -> None:
        """Commit each selected agent at its selection time, one after another."""
        loop = asyncio.get_running_loop()
        for selection in selections:
            delay = selection.at - loop.time()
            if delay > 0:
                await sleep(delay, loop)
            await self._committed(selection)

    def _committed(self, selection: Selection) -> asyncio.Task[None]:
        """The commit of ``selection`` (started on first ask: the selector, or its first
        call when that call comes in the same instant before the selector)."""
        task = self._commits.get(selection.first_call)
        if task is None:
            task = self._commits[selection.first_call] = (
                asyncio.get_running_loop().create_task(self._commit(selection)))
        return task

    async def _commit(self, selection: Selection) -> None:
        assert self._runtime is not None
        try:
            await self._runtime.held_plans.commit_to_thread(
                selection.agent, selection.thread, selection.candidates)
        except Exception as error:  # planning ahead is an optimisation, never fatal
            metrics.survived("sim", "plan", metrics.STORE,
                             f"planning at selection failed for {selection.agent}", error,
                             logger=log)

    async def _call_ended(self, call: CallSpec, finished: bool) -> None:
        """Withdraw the thread's intents (and an unused plan) once it has no calls left."""
        selection = self._selection_of.get(call.call_id)
        if selection is None or self._runtime is None:
            return
        key = selection.first_call
        left = self._calls_left.get(key, 0) - 1
        self._calls_left[key] = left
        if left <= 0 or not finished:
            self._calls_left[key] = 0
            await self._runtime.held_plans.release(selection.agent, selection.thread)

    async def stop(self) -> None:
        if self._selector is not None:
            self._selector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._selector
        if self._runtime is not None:
            await self._runtime.close()
            await self._runtime.kv.close()

    async def run_call(self, call: CallSpec, ctx: SimContext) -> SimulatedOutcome:
        """One simulated call through the runtime's call service, as production makes
        it: placed by the waiter, its ticket leased (renewed on the virtual clock, so a
        call longer than the TTL keeps its memory), retried once elsewhere after a
        refused connection, released and recorded by the service."""
        assert self._runtime is not None
        runtime = self._runtime
        prefix = self._prefix
        holder = f"{call.agent}#{call.call_id}"
        thread = (ThreadPrompt(f"{call.discussion_id}/{call.agent}", call.prompt.tokens)
                  if call.prompt is not None and prefix is not None else None)
        if thread is not None and prefix is not None:
            prefix.expect(holder, thread)  # the planner prices this call's prefill per copy
        request = CallRequest(tuple(call.candidates), agent=call.agent,
                              thread_id=str(call.call_id), phase="call",
                              prompt_tokens=call.prompt_tokens, holder=holder)
        keep_alive = runtime.settings.engine_keep_alive_seconds

        async def send(active: ActiveCall) -> float:
            gpu = ctx.gpus[active.provider]
            if prefix is not None:
                prefix.forget(holder)  # placed: its prefill is priced
                if thread is not None:
                    # the call record the runtime keeps: which copy served the thread, when
                    prefix.served(gpu.name, active.model, gpu.max_parallel, thread,
                                  runtime.clock.now())
            phases = CURRENT_CALL.get()
            if phases is not None:
                # A wait that ended on a warm or loading copy was a wait for a slot there.
                phases.joined_warm = active.placement.action in _JOINED
            ticket = active.placement.ticket
            try:
                if active.placement.action in _LOADS:
                    await gpu.preload(active.model, keep_alive=keep_alive)
                    if ticket is not None:
                        with contextlib.suppress(Exception):  # a lapsed ticket changes nothing
                            await runtime.tickets.mark_running(active.provider,
                                                               ticket.ticket_id)
                started = await gpu.serve(active.model, call.duration, keep_alive=keep_alive,
                                          prompt=call.prompt)
            except ProviderUnavailable as error:
                if not error.sent:
                    raise RefusedBeforeSending(active.provider, str(error)) from None
                raise
            # the engine's clock has no epoch; the call computed ``duration`` until now
            active.first_byte(at=runtime.clock.now() - call.duration)
            active.note(ok=True, model_calls=1)
            return started

        finished = False
        try:
            # most calls are no selection's first: no coroutine for them
            placer = (await self._held_placer(call, request)
                      if call.call_id in self._first_of else None)
            try:
                try:
                    active, started = await runtime.calls.start(request, send, placer=placer)
                finally:
                    if prefix is not None:
                        prefix.forget(holder)  # refused or failed: nothing to price any more
            except CallRefused as refused:
                if refused.refusal.final:
                    return SimulatedOutcome(REFUSED, model=call.model,
                                            reason=refused.refusal.reason.value)
                return SimulatedOutcome(STOOD_ASIDE, model=call.model,
                                        reason=refused.refusal.reason.value)
            except (ProviderError, RefusedBeforeSending) as error:
                return SimulatedOutcome(FAILED, model=call.model, reason=str(error))
            async with active:
                pass  # the call ran in send; leaving the block releases and records it
            finished = True
            return SimulatedOutcome(FINISHED, provider=active.provider, model=active.model,
                                    started=started, evicted=active.placement.evicted)
        finally:
            await self._call_ended(call, finished)

    async def _held_placer(
        self, call: CallSpec, request: CallRequest
    ) -> Callable[[str, Collection[str]], Awaitable[CallPlacement]] | None:
        """For a selected agent's first mulling call: take the plan held since its
        selection, else place through the waiter (as the agent runtime's placer does);
        ``None`` for every other call (the service's own waiter)."""
        selection = self._first_of.get(call.call_id)
        runtime = self._runtime
        if selection is None or runtime is None:
            return None
        await self._committed(selection)
        first_try = [True]

        async def place(holder: str, exclude: Collection[str]) -> CallPlacement:
            if first_try[0]:
                first_try[0] = False
                held = await runtime.held_plans.take(selection.agent, selection.thread,
                                                     prompt_tokens=request.prompt_tokens)
                if held is not None:
                    return held
            return await runtime.waiter.place(
                request.candidates, agent=request.agent, holder_id=holder,
                prompt_tokens=request.prompt_tokens, exclude=exclude)

        return place
