"""The wait budget holds while the store is unreachable (issue 22 fault 2's last part).

A call already waiting for memory when the nats-server goes away must be answered
within its budget, not after a store timeout per operation its waiter still tries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings, NatsSettings
from kubemoot.store.nats import NatsKV
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import SMALL, sources

pytestmark = pytest.mark.nats

BIG = EmulatedModel("big:5b", 4800, family="big")
BUDGET = 3.0
REQUEST_TIMEOUT = 10.0  # each store operation may block this long while it is gone


async def test_a_waiting_call_is_answered_within_its_budget_when_the_store_goes(
        nats: NatsServer, make_emulator: Callable[..., OllamaEmulator]) -> None:
    # usable 5632 MiB: big:5b waits while a long call keeps small:1b busy
    emulator = make_emulator(models=(SMALL, BIG), vram_mib=6144, time_scale=1.0,
                             base_latency_s=120.0)
    [source] = sources({"gpu": emulator})
    from dataclasses import replace
    kv = await NatsKV.connect(NatsSettings(servers=[nats.url], request_timeout=REQUEST_TIMEOUT,
                                           reconnect_wait=0.5, connect_timeout=0.5))
    gateway = GatewayServer(kv, providers=[replace(source, total_vram_mib=6144)], port=0,
                            settings=GatewaySettings(wait_limit_seconds=60.0,
                                                     provider_probe_seconds=30.0),
                            clock=SystemClock())
    await gateway.start()
    loop = asyncio.get_running_loop()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as http:
            busy = asyncio.ensure_future(http.post("/api/generate", json={
                "model": "small:1b", "prompt": "hello", "stream": False}))
            await emulator.until(lambda engine: bool(engine.records))
            started = loop.time()
            waiting = asyncio.ensure_future(http.post(
                "/api/generate", json={"model": "big:5b", "prompt": "hi", "stream": False},
                headers={"X-Kubemoot-Wait-Budget": str(BUDGET)}))
            assert gateway.stack is not None
            demand = gateway.stack.demand_bucket

            async def joined() -> bool:
                return any(str(k).startswith("wait") for k in await demand.keys())

            await wait_until(joined, timeout=30, what="big:5b waiting for memory")
            await nats.stop()
            answer = await waiting
            took = loop.time() - started
            assert answer.status_code == 503, answer.text
            assert "retry-after" in answer.headers
            # within the budget and the waiter's one short overrun, not a store timeout
            # (or several) later
            assert took < BUDGET + REQUEST_TIMEOUT / 2, took
            busy.cancel()
            await asyncio.gather(busy, return_exceptions=True)
    finally:
        await gateway.stop()
        await kv.close()
