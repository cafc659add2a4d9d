"""The static fallback of a call that cannot wait never sends work to a doomed copy.

A call that cannot wait may go to the endpoint the operator bound when no GPU is free,
but that call carries no ticket: it is only safe on a copy that is loaded and stays
loaded. A copy another call's ticket plans to unload may be gone by the time the call
reaches the engine, which would then load it again and push out what the planner put in
its place. Such a call gets the busy answer instead (the cluster path's end-to-end test
once saw the engine evict on its own this way).
"""

from __future__ import annotations

from collections.abc import Callable

from kubemoot.agent.runtime import StaticTarget
from kubemoot.agent.wiring import build_stack
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    ProviderTickets,
)
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import ticket
from tests.agent.conftest import ollama_factory

SMALL = EmulatedModel("small:1b", 2000)
OTHER = EmulatedModel("other:1b", 3000)
SETTINGS = RuntimeSettings().with_values({
    "load_rate_mibps": 1e6, "unload_seconds": 0.001, "default_latency_seconds": 0.05,
})


async def _no_wait_call(make_emulator: Callable[..., OllamaEmulator], *,
                        planned_victim: bool) -> tuple[str | None, int]:
    """A no-wait call for a model only the static endpoint holds; returns the refusal
    (None when it ran) and how many requests reached that endpoint."""
    clock = SystemClock()
    kv = MemoryKV(clock=clock)
    emulator = make_emulator(models=(SMALL, OTHER), vram_mib=8192)
    client = OllamaProvider("gpu-a", emulator.url, context_length=1024, num_parallel=1,
                            total_vram_mib=8192, reserve_mib=512)
    try:
        await client.preload(SMALL.name)
        states = await kv.bucket(PROVIDER_STATE_BUCKET)
        await Prober([client], clock=clock, publish=publish_to_kv(states)).probe_all()
        # Another call holds gpu-a's only slot on small:1b, so no placement can take it now.
        busy = [ticket(SMALL.name, now=clock.now(), holder_id="busy", ident="busy")]
        if planned_victim:  # and yet another plans to unload it for other:1b
            busy.append(ticket(OTHER.name, now=clock.now(), footprint_mib=3000,
                               evicts={SMALL.name: 2000 / 1024}, holder_id="loader",
                               ident="loader"))
        tickets = await kv.bucket(PROVIDER_TICKETS_BUCKET)
        await tickets.put("gpu-a", ProviderTickets(provider="gpu-a", tickets=busy).to_json())
        stack = await build_stack(kv, clients={"gpu-a": client}, client_factory=ollama_factory,
                                  clock=clock, settings=SETTINGS, declared={SMALL.name: 2000})
        try:
            before = len(emulator.records)
            if not planned_victim:
                # the copy is held for the call: a zero-footprint ticket, released after
                held = await stack.planner.hold_copy("gpu-a", SMALL.name, "probe",
                                                     prompt_tokens=10)
                assert held is not None and held.model_footprint_mib == 0
                assert not await stack.planner.hold_copy("gpu-a", OTHER.name, "probe",
                                                         prompt_tokens=10)
                await stack.tickets.release("gpu-a", held.ticket_id)
            outcome = await stack.agents.call(
                agent="crew/coordinator", thread_id="t1", phase="synthesis",
                messages=[{"role": "user", "content": "hello"}],
                candidates=[CandidateModel(SMALL.name, 50.0)], wait=False,
                static=StaticTarget("gpu-a", emulator.url, SMALL.name, 1024),
            )
            document, _ = await stack.tickets.read("gpu-a")
            left = sorted(t.holder_id for t in document.tickets)
        finally:
            await stack.close()
        assert left == sorted(t.holder_id for t in busy)  # the call's own ticket went back
        return outcome.refusal, len(emulator.records) - before
    finally:
        await client.close()
        await kv.close()


async def test_a_static_call_runs_on_a_copy_that_stays(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    refusal, requests = await _no_wait_call(make_emulator, planned_victim=False)
    assert (refusal, requests) == (None, 1)


async def test_a_static_call_never_goes_to_a_copy_planned_for_unloading(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    refusal, requests = await _no_wait_call(make_emulator, planned_victim=True)
    assert (refusal, requests) == ("gpu-busy", 0)
