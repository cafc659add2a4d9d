"""Issue 22 fault 1: a client's short ``keep_alive`` must not let the engine drop a copy
behind the scheduler's back (DESIGN §5, residency is a lease with an end).

The sequence that failed: a call with ``keep_alive: "1s"``, the engine unloads the copy
before the next probe, and the next call is placed *warm* with a ticket of 0 MiB while
the engine loads the model again with memory nobody booked.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from kubemoot.clock import SystemClock
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings
from kubemoot.store.memory import MemoryKV
from tests.gateway.conftest import OllamaEmulator, sources

HELLO = {"model": "medium:7b", "messages": [{"role": "user", "content": "hello"}],
         "stream": False}


async def test_a_short_keep_alive_is_raised_and_a_lapsed_copy_is_a_cold_load(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator(time_scale=0.01)  # an emulated second lasts 10 ms
    # no periodic probe during the test: only the gateway's own re-probes after a call
    settings = GatewaySettings(provider_probe_seconds=30.0, wait_limit_seconds=5.0)
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=sources({"gpu": emulator}),
                            port=0, settings=settings)
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            first = await http.post("/api/chat", json={**HELLO, "keep_alive": "1s"})
            assert first.status_code == 200, first.text
            assert first.headers["x-kubemoot-action"] == "cold-load"
            # the engine was told to keep the copy for the freshness window at least
            [(_model, copy)] = emulator.engine.copies()
            window = settings.provider_probe_seconds + gateway.runtime.state_cache_seconds
            assert copy.keep_alive >= window
            # the engine lets it go on that timer, and no probe has told the gateway
            await emulator.until(lambda engine: not engine.copies())
            second = await http.post("/api/chat", json={**HELLO, "keep_alive": "1s"})
            assert second.status_code == 200, second.text
            # a lapsed lease is no warm copy: the load is booked in full
            assert second.headers["x-kubemoot-action"] == "cold-load"
        story = emulator.engine.story()
        assert emulator.stats()["evictions"] == 0, story
        assert "evicted" not in story, story
    finally:
        await gateway.stop()


async def test_a_call_without_keep_alive_asks_for_the_runtimes_engine_keep_alive(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator()
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=sources({"gpu": emulator}),
                            port=0, settings=GatewaySettings(wait_limit_seconds=5.0))
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            reply = await http.post("/api/chat", json=HELLO)
            assert reply.status_code == 200, reply.text
        [(_model, copy)] = emulator.engine.copies()
        # the simulator's calls ask for the same (sim/runtime_policy.py)
        assert copy.keep_alive == gateway.runtime.engine_keep_alive_seconds
    finally:
        await gateway.stop()
