"""The one place the per-call runtime is assembled (DESIGN §10).

The demo and the agent runtime (through :mod:`kubemoot.agent.wiring`), the simulator's
``kubemoot`` policy, ``kubemoot place`` and the tests all call :func:`build_runtime`,
so "the simulator runs the production runtime" holds by construction: the same parts
(latency tracker, circuit breakers, view, tickets, demand board, occupancy, planner,
capacity watch, waiter, held plans, call service) built from the same settings.

Building and starting are two steps: between them a caller may seed the buckets (the
simulator publishes its cards' states, ``kubemoot place`` writes a snapshot) and
observe latencies. :meth:`Runtime.start` then follows the buckets' watches and starts
the capacity watch; :meth:`Runtime.close` stops both. The store stays the caller's.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Mapping
from dataclasses import dataclass

from kubemoot.clock import Clock
from kubemoot.providers.protocol import ProviderClient
from kubemoot.runtime.calls import CallService
from kubemoot.runtime.capacity import CapacityWatch, WatchUnavailable
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.runtime.demand import DemandBoard
from kubemoot.runtime.held_plans import HeldPlans
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.runtime.waiting import CapacityWaiter
from kubemoot.runtime.watching import ParsedDocuments
from kubemoot.settings import RuntimeSettings
from kubemoot.store.bus import Bus
from kubemoot.store.documents import (
    MODEL_DEMAND_BUCKET,
    MODEL_DEMAND_MAX_AGE_SECONDS,
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    TICKET_REQUESTS_BUCKET,
    TICKET_REQUESTS_MAX_AGE_SECONDS,
    ProviderTickets,
)
from kubemoot.store.protocol import KV, Bucket

__all__ = ["Runtime", "build_runtime"]


@dataclass(frozen=True, slots=True)
class Runtime:
    """One process's per-call runtime over one store; built by :func:`build_runtime`."""

    kv: KV
    clock: Clock
    settings: RuntimeSettings
    states: Bucket
    tickets_bucket: Bucket
    demand_bucket: Bucket
    latency: LatencyTracker
    circuits: CircuitBreakers
    view: ProviderView
    tickets: TicketManager
    board: DemandBoard
    occupancy: OccupancyBook
    planner: CallPlanner
    watch: CapacityWatch
    waiter: CapacityWaiter
    held_plans: HeldPlans
    calls: CallService  # every call's lifecycle (its after_load hook is the caller's)

    async def start(self, *, follow: bool = True, watch: bool = True) -> None:
        """Follow the buckets (``follow``) and start the capacity watch (``watch``).

        A view that follows reads only what changed; one that does not reads the
        buckets again after its cache window (what a throw-away decision or a test that
        writes documents behind the view's back wants). A store that cannot watch still
        works: the view reads, and the waiter has no wake source, so busy calls stand
        aside at once (:attr:`waking`).
        """
        if follow:
            await self.view.follow()
            await self.board.follow()
            # the claim line's entrance: other processes' announced claims, from now on
            await self.tickets.open()
        if watch:
            # On failure watch.started stays False: the waiter stands busy calls aside.
            with contextlib.suppress(WatchUnavailable):
                await self.watch.start()

    @property
    def waking(self) -> CapacityWatch | None:
        """The capacity watch when it runs, else None (there is no wake source)."""
        return self.watch if self.watch.started else None

    async def close(self) -> None:
        """Stop the capacity watch and the view's watches (the store stays open)."""
        await self.watch.close()
        await self.view.close()
        await self.board.close()
        await self.tickets.aclose()


async def build_runtime(
    kv: KV,
    *,
    clock: Clock,
    settings: RuntimeSettings | None = None,
    clients: Mapping[str, ProviderClient] | None = None,
    declared: Mapping[str, int] | None = None,
    rng: random.Random | None = None,
    bus: Bus | None = None,
) -> Runtime:
    """Open the three buckets and assemble the runtime over them (not yet started).

    ``clients`` are the providers' clients the planner unloads and preloads through;
    ``declared`` maps model identifiers to their declared ``vramMib`` (used until a
    footprint is observed); ``rng`` seeds the claims' back-off (the simulator's own,
    so a run repeats); ``bus``, the process's message bus: under contention its ticket
    operations go to the provider's combiner there
    (:mod:`kubemoot.runtime.ticket_delegation`).
    """
    settings = settings or RuntimeSettings()
    states = await kv.bucket(PROVIDER_STATE_BUCKET)
    tickets_bucket = await kv.bucket(PROVIDER_TICKETS_BUCKET)
    demand_bucket = await kv.bucket(MODEL_DEMAND_BUCKET, max_age=MODEL_DEMAND_MAX_AGE_SECONDS)
    # Claims that lost a race are announced here for any process's writer to apply
    # (the claim line across processes); a request time of 0 keeps every claim racing.
    requests = (
        await kv.bucket(TICKET_REQUESTS_BUCKET, max_age=TICKET_REQUESTS_MAX_AGE_SECONDS)
        if settings.claim_request_seconds > 0 else None
    )
    latency = LatencyTracker(
        alpha=settings.latency_ema_alpha, default_seconds=settings.default_latency_seconds
    )
    circuits = CircuitBreakers(
        clock=clock, threshold=settings.circuit_failure_threshold,
        cooldown_seconds=settings.circuit_cooldown_seconds,
    )
    # The view and the capacity watch both follow the ticket bucket: one parse per
    # revision for both, and none of what the ticket manager writes.
    ticket_documents = ParsedDocuments(ProviderTickets.from_json)
    view = ProviderView(states, tickets_bucket, clock=clock, settings=settings,
                        latency=latency, circuits=circuits, ticket_documents=ticket_documents)
    tickets = TicketManager(tickets_bucket, states, clock=clock,
                            ttl_seconds=settings.ticket_ttl_seconds,
                            max_attempts=settings.claim_attempts, rng=rng,
                            line_seconds=settings.claim_line_seconds,
                            requests=requests,
                            request_seconds=settings.claim_request_seconds, bus=bus,
                            parsed=ticket_documents)
    board = DemandBoard(demand_bucket, clock=clock, settings=settings)
    occupancy = OccupancyBook(settings=settings, declared=declared)
    planner = CallPlanner(
        view, tickets, states=states, settings=settings,
        occupancy=occupancy, demand=board, clients=clients,
    )
    watch = CapacityWatch(states, tickets_bucket, clock=clock, documents=ticket_documents)
    waiter = CapacityWaiter(planner, clock=clock, watch=watch, board=board)
    held_plans = HeldPlans(planner, clock=clock, board=board)
    calls = CallService(planner, waiter, clock, board=board,
                        idle_retry_seconds=settings.probe_interval_seconds)
    return Runtime(kv, clock, settings, states, tickets_bucket, demand_bucket, latency,
                   circuits, view, tickets, board, occupancy, planner, watch, waiter,
                   held_plans, calls)
