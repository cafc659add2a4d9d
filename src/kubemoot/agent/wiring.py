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
from kubemoot.runtime.builder import Runtime, build_runtime
from kubemoot.runtime.demand import DemandBoard
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import RuntimeSettings
from kubemoot.store.bus import Bus
from kubemoot.store.protocol import KV, Bucket

__all__ = ["RuntimeStack", "build_stack"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RuntimeStack:
    """The runtime's parts for one process, and the agent runtime on top of them.

    ``runtime`` is the one :class:`~kubemoot.runtime.builder.Runtime`; the properties
    name its parts, for callers written before it (``watch`` is None when the store
    cannot watch).
    """

    runtime: Runtime
    agents: AgentRuntime

    @property
    def clock(self) -> Clock:
        return self.runtime.clock

    @property
    def settings(self) -> RuntimeSettings:
        return self.runtime.settings

    @property
    def tickets_bucket(self) -> Bucket:
        return self.runtime.tickets_bucket

    @property
    def view(self) -> ProviderView:
        return self.runtime.view

    @property
    def tickets(self) -> TicketManager:
        return self.runtime.tickets

    @property
    def planner(self) -> CallPlanner:
        return self.runtime.planner

    @property
    def board(self) -> DemandBoard:
        return self.runtime.board

    async def close(self) -> None:
        """Stop the watch and close the pool's clients (the store stays the caller's)."""
        await self.runtime.close()
        try:
            await self.agents.pool.close()
        except Exception as error:  # closing connections must not stop the shutdown
            metrics.survived("agent", "close-pool", metrics.CLEANUP,
                             "closing the chat pool's clients failed", error, logger=log)


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
    bus: Bus | None = None,
) -> RuntimeStack:
    """Open the three buckets and wire the runtime over them.

    ``clients`` are the providers' clients the planner unloads and preloads through;
    ``client_factory`` builds the chat pool's clients; ``declared`` maps model
    identifiers to their declared ``vramMib`` (used until a footprint is observed).
    Without a capacity watch (the store cannot watch) busy calls stand aside at once.
    ``bus``, the process's message bus, carries its contended ticket operations to the
    provider's combiner (:mod:`kubemoot.runtime.ticket_delegation`). Without
    ``settings`` the stack takes the defaults: the entry point that read the
    ``KUBEMOOT_*`` variables passes what it read (DESIGN §10: nothing below an entry
    point reads the environment).
    """
    settings = settings if settings is not None else RuntimeSettings()
    runtime = await build_runtime(kv, clock=clock, settings=settings, clients=clients,
                                  declared=declared, bus=bus)
    # Follow the buckets' watches so each placement reads only what changed; a store
    # that cannot watch still works, by reading.
    await runtime.start()
    runtime.calls.after_load = after_call
    agents = AgentRuntime(calls=runtime.calls, held_plans=runtime.held_plans,
                          pool=ChatPool(client_factory,
                                        keep_alive=settings.engine_keep_alive_seconds),
                          limits=limits)
    return RuntimeStack(runtime, agents)
