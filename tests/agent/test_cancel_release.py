"""A call cancelled after it ran still gives its VRAM ticket back at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kubemoot.agent.pool import CallSettings
from kubemoot.agent.wiring import build_stack
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.providers.protocol import ProviderClient
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, PROVIDER_TICKETS_BUCKET
from kubemoot.store.memory import MemoryKV

SMALL = EmulatedModel("small:1b", 2000)
FAST = RuntimeSettings().with_values({
    "load_rate_mibps": 1e6, "unload_seconds": 0.001, "default_latency_seconds": 0.05,
})


async def test_cancelling_during_the_after_call_probe_still_releases_the_ticket(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator(models=(SMALL,), vram_mib=8192)
    clock = SystemClock()
    kv = MemoryKV(clock=clock)
    client = OllamaProvider("gpu-a", emulator.url, context_length=1024, num_parallel=2,
                            total_vram_mib=8192, reserve_mib=512)
    prober = Prober([client], clock=clock,
                    publish=publish_to_kv(await kv.bucket(PROVIDER_STATE_BUCKET)))
    await prober.probe_all()
    probing = asyncio.Event()

    async def stuck_probe(provider: str) -> None:
        probing.set()
        await asyncio.Event().wait()  # never returns: the call is cancelled here

    def factory(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
        return OllamaProvider(provider, endpoint, timeout=settings.timeout)

    stack = await build_stack(kv, clients={"gpu-a": client}, client_factory=factory,
                              clock=clock, settings=FAST, declared={"small:1b": 2000},
                              after_call=stuck_probe)
    try:
        call = asyncio.create_task(stack.agents.call(
            agent="crew/a", thread_id="t1", phase="mulling",
            messages=[{"role": "user", "content": "hello"}],
            candidates=[CandidateModel("small:1b", 50.0)], wait=False,
        ))
        await asyncio.wait_for(probing.wait(), 10)
        assert await stack.tickets.active("gpu-a"), "the call holds a ticket while it runs"
        changes = (await kv.bucket(PROVIDER_TICKETS_BUCKET)).watch()
        await changes.ready()
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)

        async def released() -> None:  # the shielded release finishes on its own
            while await stack.tickets.active("gpu-a"):
                await changes.__anext__()  # the release is a write of the tickets document

        await asyncio.wait_for(released(), 10)
    finally:
        await stack.close()
        await client.close()
        await kv.close()
