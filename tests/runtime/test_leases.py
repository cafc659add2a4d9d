"""Leases in the runtime: a held plan and a running call keep their tickets past the TTL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from kubemoot.agent.pool import CallSettings
from kubemoot.agent.wiring import build_stack
from kubemoot.clock import LoopClock, SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.providers.protocol import ProviderClient
from kubemoot.runtime.held_plans import HeldPlans
from kubemoot.runtime.placement import Action, CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.sim.vloop import run_virtual
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    TicketState,
)
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.emulators import emulator_factory
from kubemoot.testing.state import NOW, gpu
from tests.runtime.builders import candidates, harness

SHORT_TTL = RuntimeSettings().with_values({
    "ticket_ttl_seconds": 30.0, "held_plan_ttl_seconds": 180.0,
})


# The two tests below run on a virtual-time loop (run_virtual): their asyncio sleeps are
# the time passing that the test is about, and cost nothing real.


def test_a_plan_held_longer_than_the_ticket_ttl_is_taken_with_a_fresh_expiry() -> None:
    async def main() -> tuple[Action, float, float, int]:
        clock = LoopClock(epoch=NOW)
        h = await harness([gpu("a", 24)], declared={"m": 12}, settings=SHORT_TTL,
                          kv=MemoryKV(clock=clock), clock=clock)  # type: ignore[arg-type]
        plans = HeldPlans(h.planner, clock=clock)
        placed = await plans.commit_to_thread("crew/a", "t1", candidates("m"))
        await asyncio.sleep(100.0)  # triage takes longer than the ticket's TTL
        alive = len(await h.active("a"))
        taken = await plans.take("crew/a", "t1", prompt_tokens=100)
        assert taken is not None and taken.ticket is not None and placed.ticket is not None
        assert taken.ticket.ticket_id == placed.ticket.ticket_id
        left = taken.ticket.expires_at - clock.now()
        await plans.close_thread("t1")
        await h.close()
        return taken.action, left, taken.ticket.expires_at - placed.ticket.expires_at, alive

    action, left, moved, alive = run_virtual(main())
    assert action is Action.COLD_LOAD
    assert alive == 1
    assert left == pytest.approx(30.0)  # a whole TTL for the call that took it
    assert moved >= 100.0


def test_a_dropped_plan_stops_renewing() -> None:
    async def main() -> int:
        clock = LoopClock(epoch=NOW)
        h = await harness([gpu("a", 24)], declared={"m": 12}, settings=SHORT_TTL,
                          kv=MemoryKV(clock=clock), clock=clock)  # type: ignore[arg-type]
        plans = HeldPlans(h.planner, clock=clock)
        await plans.commit_to_thread("crew/a", "t1", candidates("m"))
        plan = plans.held("crew/a", "t1")
        assert plan is not None and plan.lease is not None
        lease = plan.lease
        await plans.release("crew/a", "t1")
        renewals = lease.renewals
        await asyncio.sleep(100.0)
        assert lease.renewals == renewals
        left = len(await h.active("a"))
        await h.close()
        return left

    assert run_virtual(main()) == 0


LONG = EmulatedModel("long:1b", 2000)


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., OllamaEmulator]]:
    # A call lasts a minute of real time: far longer than the ticket's TTL below; the
    # test cancels it once it has seen the renewal.
    card: dict[str, object] = {
        "models": (LONG,), "vram_mib": 8192, "reserve_mib": 512, "num_parallel": 2,
        "context_length": 1024,
        "base_latency_s": 60.0, "per_token_s": 0.0, "time_scale": 1.0,
    }
    with emulator_factory(card) as make:
        yield make


async def test_a_running_call_renews_its_ticket_until_it_ends(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator()
    clock = SystemClock()
    kv = MemoryKV(clock=clock)
    client = OllamaProvider("gpu-a", emulator.url, context_length=1024, num_parallel=2,
                            total_vram_mib=8192, reserve_mib=512)
    prober = Prober([client], clock=clock,
                    publish=publish_to_kv(await kv.bucket(PROVIDER_STATE_BUCKET)))
    await prober.probe_all()

    def factory(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
        return OllamaProvider(provider, endpoint, timeout=settings.timeout)

    settings = RuntimeSettings().with_values({
        "load_rate_mibps": 1e6, "unload_seconds": 0.001, "ticket_ttl_seconds": 3.0,
    })
    stack = await build_stack(kv, clients={"gpu-a": client}, client_factory=factory,
                              clock=clock, settings=settings, declared={"long:1b": 2000})
    try:
        call = asyncio.create_task(stack.agents.call(
            agent="crew/a", thread_id="t1", phase="mulling",
            messages=[{"role": "user", "content": "hello"}],
            candidates=[CandidateModel("long:1b", 50.0)], wait=False,
        ))

        changes = (await kv.bucket(PROVIDER_TICKETS_BUCKET)).watch()
        await changes.ready()

        async def renewed() -> None:
            first: float | None = None
            while True:
                active = await stack.tickets.active("gpu-a")
                if active and first is None:
                    first = active[0].expires_at
                if active and first is not None and active[0].expires_at > first:
                    assert active[0].state in (TicketState.RUNNING, TicketState.LOADING)
                    return
                await changes.__anext__()  # a renewal is a write of the tickets document

        # Without renewals the ticket lapses 3 s after its claim and its expiry never
        # moves; with them it moves every second.
        await asyncio.wait_for(renewed(), 20)
        assert not call.done()
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
    finally:
        await stack.close()
        await client.close()
        await kv.close()
