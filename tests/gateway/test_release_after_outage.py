"""A ticket whose release met a NATS outage is given back once the store is back.

A call is running (the engine stalls its answer) when the nats-server stops for longer
than the client's reconnect rounds (made short here), so the call ends while the store
does not answer and its release fails. The gateway is alive and knows it holds that
ticket: once the store answers again the ticket must go, not stay counted on the card
for the rest of its TTL (180 s, minutes of a slot and its memory held by nobody).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings, NatsSettings, ProcessSettings
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.nats import NatsKV
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import sources

pytestmark = pytest.mark.nats

CHAT = {"model": "small:1b", "messages": [{"role": "user", "content": "hi"}], "stream": False}


async def tickets_on_gpu_a(gateway: GatewayServer) -> list[str]:
    """The unexpired tickets of gpu-a's document. One get per look: a key listing
    makes a consumer each time, and polling that runs into the server's limit."""
    assert gateway.stack is not None
    entry = await gateway.stack.tickets_bucket.get("gpu-a")
    if entry is None:
        return []
    now = gateway.clock.now()
    doc = ProviderTickets.from_json(entry.value)
    return [t.holder_id for t in doc.tickets if t.expires_at > now]


async def test_a_release_the_outage_refused_is_made_once_the_store_is_back(
        nats: NatsServer, make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator()
    # two reconnect rounds 0.1 s apart: the client gives up within a second or so
    kv = await NatsKV.connect(NatsSettings(servers=[nats.url], max_reconnect_attempts=2,
                                           reconnect_wait=0.1, request_timeout=1.0,
                                           connect_timeout=0.5))
    gateway = GatewayServer(
        kv, providers=sources({"gpu-a": emulator}), port=0,
        settings=GatewaySettings(wait_limit_seconds=5.0, provider_probe_seconds=0.5),
        process=ProcessSettings(store_check_seconds=0.3), clock=SystemClock())
    await gateway.start()
    health = gateway.health
    assert health is not None
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            assert (await http.post("/api/chat", json=CHAT)).status_code == 200

            emulator.stall_next(4.0, path="/api/chat")
            running = asyncio.ensure_future(http.post("/api/chat", json=CHAT))

            async def holding() -> bool:
                return bool(await tickets_on_gpu_a(gateway))

            await wait_until(holding, timeout=30, what="the stalled call holding its ticket")
            await nats.stop()
            await wait_until(lambda: kv.connection.is_closed, timeout=60,
                             what="nats-py giving up on its connection")
            answer = await running  # the engine answered; the release met the outage
            assert answer.status_code == 200, answer.text

            await nats.start()  # the same port and store: the ticket is still there
            await wait_until(lambda: health.store_lost() is None, timeout=60,
                             what="the gateway finding the store again")

            for _ in range(2):  # the calls after the outage run
                again = await http.post("/api/chat", json=CHAT)
                assert again.status_code == 200, again.text

            async def released() -> bool:
                return await tickets_on_gpu_a(gateway) == []

            # well within the ticket's TTL (180 s): only a new release can pass this
            await wait_until(released, timeout=30,
                             what="the ticket the outage kept being released")
    finally:
        await gateway.stop()
        await kv.close()
