"""Assemble the per-call runtime and the agent runtime over one store.

Everything here speaks protocols only: a :class:`~kubemoot.store.protocol.KV` (the
embedded store or NATS) and :class:`~kubemoot.providers.protocol.ProviderClient` per
provider (Ollama, the emulator). Which adapters stand behind them is the caller's
choice, so the same stack serves the demo, tests and a real agent process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from kubemoot import metrics
from kubemoot.agent.pool import ChatPool, ClientFactory
from kubemoot.agent.runtime import AfterCall, AgentRuntime
from kubemoot.agent.toolloop import ToolLoopLimits
from kubemoot.clock import Clock
from kubemoot.providers.protocol import ProviderClient
from kubemoot.runtime.capacity import CapacityWatch, WatchUnavailable
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.runtime.demand import DemandBoard
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.selection import SelectionPlanner
from kubemoot.runtime.selector import ProviderSelector
from kubemoot.runtime.settings import RuntimeSettings
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.runtime.waiting import CapacityWaiter
from kubemoot.store.documents import (
    MODEL_DEMAND_BUCKET,
    MODEL_DEMAND_MAX_AGE_SECONDS,
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
)
from kubemoot.store.protocol import KV, Bucket

__all__ = ["RuntimeStack", "build_stack"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RuntimeStack:
    """The runtime's parts for one process, and the agent runtime on top of them."""

    kv: KV
    clock: Clock
    settings: RuntimeSettings
    states: Bucket
    tickets_bucket: Bucket
    demand_bucket: Bucket
    view: ProviderView
    tickets: TicketManager
    planner: CallPlanner
    board: DemandBoard
    watch: CapacityWatch | None
    agents: AgentRuntime

    async def close(self) -> None:
        """Stop the watch and close the pool's clients (the store stays the caller's)."""
        if self.watch is not None:
            await self.watch.close()
        await self.view.close()
        try:
            await self.agents.pool.close()
        except Exception as error:  # closing connections must not stop the shutdown
            log.warning("closing the chat pool's clients failed: %s: %s",
                        type(error).__name__, error)
            metrics.ERRORS_SURVIVED.labels(component="agent", operation="close-pool").inc()


async def build_stack(
    kv: KV,
    *,
    clients: Mapping[str, ProviderClient],
    client_factory: ClientFactory,
    clock: Clock,
    settings: RuntimeSettings | None = None,
    declared: Mapping[str, int] | None = None,
    after_call: AfterCall | None = None,
    limits: ToolLoopLimits | None = None,
) -> RuntimeStack:
    """Open the three buckets and wire the runtime over them.

    ``clients`` are the providers' clients the planner unloads and preloads through;
    ``client_factory`` builds the chat pool's clients; ``declared`` maps model
    identifiers to their declared ``vramMib`` (used until a footprint is observed).
    Without a capacity watch (the store cannot watch) busy calls stand aside at once.
    """
    settings = settings or RuntimeSettings()
    states = await kv.bucket(PROVIDER_STATE_BUCKET)
    tickets_bucket = await kv.bucket(PROVIDER_TICKETS_BUCKET)
    demand_bucket = await kv.bucket(MODEL_DEMAND_BUCKET, max_age=MODEL_DEMAND_MAX_AGE_SECONDS)
    latency = LatencyTracker(
        alpha=settings.latency_ema_alpha, default_seconds=settings.default_latency_seconds
    )
    circuits = CircuitBreakers(
        clock=clock, threshold=settings.circuit_failure_threshold,
        cooldown_seconds=settings.circuit_cooldown_seconds,
    )
    view = ProviderView(states, tickets_bucket, clock=clock, settings=settings,
                        latency=latency, circuits=circuits)
    # Follow the buckets' watches so each placement reads only what changed; a store
    # that cannot watch still works, by reading.
    await view.follow()
    tickets = TicketManager(tickets_bucket, states, clock=clock,
                            ttl_seconds=settings.ticket_ttl_seconds,
                            max_attempts=settings.claim_attempts,
                            line_seconds=settings.claim_line_seconds)
    board = DemandBoard(demand_bucket, clock=clock)
    occupancy = OccupancyBook(settings=settings, declared=declared)
    planner = CallPlanner(
        ProviderSelector(view, tickets), states=states, settings=settings,
        occupancy=occupancy, demand=board, clients=clients,
    )
    capacity = CapacityWatch(states, tickets_bucket, clock=clock)
    watch: CapacityWatch | None = capacity
    try:
        await capacity.start()
    except WatchUnavailable:
        watch = None
    waiter = CapacityWaiter(planner, clock=clock, watch=watch, board=board)
    selection = SelectionPlanner(planner, clock=clock, board=board)
    agents = AgentRuntime(
        planner=planner, waiter=waiter, selection=selection,
        pool=ChatPool(client_factory), clock=clock, after_call=after_call, board=board,
        limits=limits,
    )
    return RuntimeStack(kv, clock, settings, states, tickets_bucket, demand_bucket, view,
                        tickets, planner, board, watch, agents)
