"""The ``kubemoot`` policy: the production per-call runtime, unchanged, in virtual time.

Everything here is wiring; no placement logic lives in the simulator. The runtime's
objects (:class:`~kubemoot.runtime.planner.CallPlanner`, ProviderSelector,
TicketManager, DemandBoard, CapacityWatch, ProviderView) run on a
:class:`~kubemoot.store.memory.MemoryKV` with a :class:`~kubemoot.clock.LoopClock`,
which under the simulator's loop reads virtual time; the emulated GPUs are their
provider clients. A publisher plays the operator's prober: whenever a card's resident
set changes it writes the card's provider-state document (as ``/api/ps`` would show it).

One runtime instance serves every simulated agent, like one gateway process: tickets
still go through compare-and-set on the shared documents, and the 200 ms state cache
works in virtual time.

A call goes through the production :class:`~kubemoot.runtime.waiting.CapacityWaiter`:
when the answer is ``queue`` or ``wait`` (busy) it joins the waiter's first-come line,
holds a ``wait.<model>.<agent>`` entry and places again as capacity changes, standing
aside with ``gpu-busy`` when the scenario's wait limit passes; ``refuse`` stands aside
at once with its reason. The view follows the buckets through watches, as a long-lived
gateway process would. Once placed, a cold load or an
unload plan waits for the model to be ready, marks its ticket running, and computes;
the ticket is released in a ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib

from kubemoot.clock import LoopClock
from kubemoot.providers.protocol import ProviderClient, ProviderError
from kubemoot.runtime.capacity import CapacityWatch
from kubemoot.runtime.demand import DemandBoard
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.placement import Action, Candidate, Placement
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.selector import ProviderSelector
from kubemoot.runtime.settings import DEFAULTS, RuntimeSettings
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.runtime.waiting import CapacityWaiter
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.metrics import FAILED, FINISHED, REFUSED, STOOD_ASIDE, CallOutcome
from kubemoot.sim.phases import CURRENT_CALL
from kubemoot.sim.policies import Policy, SimContext
from kubemoot.sim.workload import CallSpec
from kubemoot.store.documents import (
    MODEL_DEMAND_BUCKET,
    MODEL_DEMAND_MAX_AGE_SECONDS,
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import Bucket

__all__ = ["KubemootPolicy"]

GPU_BUSY = "gpu-busy"


class _StatePublisher:
    """Writes a card's provider-state document after each change of its resident set."""

    def __init__(self, gpu: EmulatedGpu, bucket: Bucket, clock: LoopClock) -> None:
        self._gpu = gpu
        self._bucket = bucket
        self._clock = clock
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
        await self._bucket.put(encode_token(self._gpu.name), document.to_json())


class KubemootPolicy(Policy):
    """Per-call placement by :mod:`kubemoot.runtime` (see the module docstring)."""

    name = "kubemoot"

    def __init__(self, settings: RuntimeSettings | None = None) -> None:
        self._settings = settings
        self._kv: MemoryKV | None = None
        self._watch: CapacityWatch | None = None
        self._planner: CallPlanner | None = None
        self._demand: DemandBoard | None = None
        self._view: ProviderView | None = None
        self._waiter: CapacityWaiter | None = None
        self._wait_limit = DEFAULTS.gpu_wait_limit_seconds

    async def start(self, ctx: SimContext) -> None:
        clock = LoopClock(epoch=ctx.epoch)
        clock.now()  # anchor the clock at loop time 0
        wait_limit = ctx.extras.get("gpu_wait_limit_seconds", DEFAULTS.gpu_wait_limit_seconds)
        self._wait_limit = (
            float(wait_limit) if isinstance(wait_limit, int | float)
            else DEFAULTS.gpu_wait_limit_seconds
        )
        settings = self._settings or RuntimeSettings(gpu_wait_limit_seconds=self._wait_limit)
        kv = MemoryKV(clock)
        self._kv = kv
        states = await kv.bucket(PROVIDER_STATE_BUCKET)
        tickets = await kv.bucket(PROVIDER_TICKETS_BUCKET)
        demand_bucket = await kv.bucket(MODEL_DEMAND_BUCKET, max_age=MODEL_DEMAND_MAX_AGE_SECONDS)
        for gpu in ctx.gpus.values():
            await _StatePublisher(gpu, states, clock).publish()
        manager = TicketManager(
            tickets, states, clock=clock, ttl_seconds=settings.ticket_ttl_seconds,
            max_attempts=settings.claim_attempts, rng=ctx.rng,
            line_seconds=settings.claim_line_seconds,
        )
        view = ProviderView(states, tickets, clock=clock, settings=settings)
        self._demand = DemandBoard(demand_bucket, clock=clock)
        clients: dict[str, ProviderClient] = dict(ctx.gpus)
        self._planner = CallPlanner(
            ProviderSelector(view, manager), states=states, settings=settings,
            occupancy=OccupancyBook(settings=settings, declared=ctx.sizes),
            demand=self._demand, clients=clients,
        )
        self._watch = CapacityWatch(states, tickets, clock=clock)
        await self._watch.start()
        await view.follow()
        self._view = view
        self._waiter = CapacityWaiter(
            self._planner, clock=clock, watch=self._watch, board=self._demand,
            limit_seconds=self._wait_limit,
        )

    async def stop(self) -> None:
        if self._view is not None:
            await self._view.close()
        if self._watch is not None:
            await self._watch.close()
        if self._kv is not None:
            await self._kv.close()

    async def run_call(self, call: CallSpec, ctx: SimContext) -> CallOutcome:
        assert self._planner is not None and self._watch is not None
        assert self._demand is not None
        placement = await self._place(call)
        if isinstance(placement, CallOutcome):
            return placement
        assert placement.provider is not None and placement.model is not None
        gpu = ctx.gpus[placement.provider]
        ok = False
        try:
            if placement.action in (Action.COLD_LOAD, Action.UNLOAD, Action.LOADING):
                await gpu.preload(placement.model)
                if placement.ticket is not None:
                    with contextlib.suppress(Exception):  # a lapsed ticket changes nothing
                        await self._planner.selector.tickets.mark_running(
                            placement.provider, placement.ticket.ticket_id
                        )
            started = await gpu.serve(placement.model, call.duration)
            ok = True
        except ProviderError as error:
            return CallOutcome(FAILED, provider=gpu.name, model=placement.model, reason=str(error))
        finally:
            await self._planner.finish(placement, seconds=call.duration if ok else None, ok=ok)
        await self._demand.record_use(placement.model)
        return CallOutcome(FINISHED, provider=gpu.name, model=placement.model, started=started,
                           evicted=placement.evicted)

    async def _place(self, call: CallSpec) -> Placement | CallOutcome:
        assert self._waiter is not None
        placement = await self._waiter.place(
            [Candidate(c.model, c.score) for c in call.candidates],
            agent=call.agent, holder_id=f"{call.agent}#{call.call_id}",
            prompt_tokens=call.prompt_tokens,
        )
        if placement.placed:
            phases = CURRENT_CALL.get()
            if phases is not None:
                # A wait that ended on a warm or loading copy was a wait for a slot there.
                phases.joined_warm = placement.action in (Action.WARM, Action.LOADING)
            return placement
        if placement.action is Action.REFUSE:
            return CallOutcome(REFUSED, model=call.model, reason=placement.reason)
        return CallOutcome(STOOD_ASIDE, model=call.model, reason=placement.reason or GPU_BUSY)
