"""A planner on MemoryKV for runtime tests (provider states and tickets: kubemoot.testing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kubemoot.clock import ManualClock
from kubemoot.runtime.builder import build_runtime
from kubemoot.runtime.capacity import CapacityWatch
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.runtime.demand import DemandBoard
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.placement import CallPlacement, CandidateModel
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import (
    ProviderState,
    ProviderTickets,
    Ticket,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import KV, Bucket
from kubemoot.testing.state import GIB, NOW


@dataclass
class Harness:
    """A planner on a real embedded store, at a manual clock standing at NOW."""

    kv: KV
    clock: ManualClock
    states: Bucket
    tickets_bucket: Bucket
    demand_bucket: Bucket
    board: DemandBoard
    tickets: TicketManager
    view: ProviderView
    planner: CallPlanner
    latency: LatencyTracker
    circuits: CircuitBreakers
    watches: list[CapacityWatch] = field(default_factory=list)

    async def place(
        self, *models: str | tuple[str, float], prompt: int | None = None, holder: str = "me"
    ) -> CallPlacement:
        return await self.planner.place(candidates(*models), holder_id=holder,
                                        prompt_tokens=prompt)

    async def set_state(self, state: ProviderState) -> None:
        await self.states.put(encode_token(state.provider), state.to_json())
        self.view.invalidate()

    async def set_tickets(self, provider: str, tickets: Sequence[Ticket]) -> None:
        doc = ProviderTickets(provider=provider, tickets=list(tickets))
        await self.tickets_bucket.put(encode_token(provider), doc.to_json())
        self.view.invalidate()

    async def active(self, provider: str) -> list[Ticket]:
        return await self.tickets.active(provider)

    async def watch(self) -> CapacityWatch:
        watch = CapacityWatch(self.states, self.tickets_bucket, clock=self.clock)
        await watch.start()
        self.watches.append(watch)
        return watch

    async def close(self) -> None:
        for watch in self.watches:
            await watch.close()
        await self.kv.close()


def candidates(*models: str | tuple[str, float]) -> list[CandidateModel]:
    return [CandidateModel(m) if isinstance(m, str) else CandidateModel(m[0], m[1]) for m in models]


async def harness(
    providers: Sequence[ProviderState],
    *,
    tickets: Mapping[str, Sequence[Ticket]] | None = None,
    declared: Mapping[str, float] | None = None,
    latency: Mapping[str, float] | None = None,
    settings: RuntimeSettings | None = None,
    kv: KV | None = None,
    clock: ManualClock | None = None,
) -> Harness:
    """Write the providers and tickets into a store and build the runtime over it."""
    clock = clock or ManualClock(NOW)
    kv = kv or MemoryKV(clock=clock)
    runtime = await build_runtime(
        kv, clock=clock, settings=settings,
        declared={m: int(g * GIB) for m, g in (declared or {}).items()},
    )
    for state in providers:
        await runtime.states.put(encode_token(state.provider), state.to_json())
    for provider, provider_tickets in (tickets or {}).items():
        doc = ProviderTickets(provider=provider, tickets=list(provider_tickets))
        await runtime.tickets_bucket.put(encode_token(provider), doc.to_json())
    for name, seconds in (latency or {}).items():
        runtime.latency.observe(f"http://{name}:11434", seconds)
    # Not started: tests write documents behind the view's back and invalidate it.
    return Harness(kv, clock, runtime.states, runtime.tickets_bucket, runtime.demand_bucket,
                   runtime.board, runtime.tickets, runtime.view, runtime.planner,
                   runtime.latency, runtime.circuits)
