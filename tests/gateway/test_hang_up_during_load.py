"""Issue 22 item 12: a cold load the gateway started goes on when its client hangs up.

The copy ends warm for the next call, and the call's ticket is released once the engine
holds the copy (its memory is then the copy's, seen by the probe), never leaked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from kubemoot.clock import SystemClock
from kubemoot.emulation.engine import CopyState
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import OllamaEmulator, finished_calls, live_tickets, sources

BODY = {"model": "medium:7b", "messages": [{"role": "user", "content": "hello"}],
        "stream": False}


async def test_a_client_that_hangs_up_during_the_load_leaves_a_warm_copy(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    # 4000 MiB at the default load rate: a load of about four real seconds
    emulator = make_emulator(time_scale=1.0, base_latency_s=0.0, per_token_s=0.0)
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=sources({"gpu": emulator}),
                            port=0, settings=GatewaySettings(wait_limit_seconds=30.0))
    await gateway.start()
    finished = finished_calls(gateway)
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            call = asyncio.ensure_future(http.post("/api/chat", json=BODY))
            # the card says when a copy is ready, not when its load starts: look
            await wait_until(lambda: any(c.state is CopyState.LOADING
                                         for _m, c in emulator.engine.copies()),
                             timeout=30, what="the engine loading medium:7b")
            call.cancel()  # the client hangs up while the engine loads
            await asyncio.gather(call, return_exceptions=True)
            await finished.until(1)
            # the load went on: the copy is ready, and no ticket is left behind
            await emulator.until(lambda engine: any(
                c.state is CopyState.READY for _m, c in engine.copies()))
            assert await live_tickets(gateway) == []
            again = await http.post("/api/chat", json=BODY)
            assert again.status_code == 200, again.text
            assert again.headers["x-kubemoot-action"] == "warm"
        assert emulator.stats()["loads"] == 1
    finally:
        await gateway.stop()
