"""Fault 2 (issue 22): a gateway whose NATS client gave up comes back with the store.

The nats-server stops for longer than the client's reconnect rounds (made short here),
so nats-py closes the connection for good. Meanwhile calls are answered 503 with
``Retry-After`` within their wait budget, ``/readyz`` says why, and the log says so at
WARNING; once the server is back the store connects again and calls succeed — twice.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from kubemoot.cli._common import StoreLossFilter
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings, NatsSettings, ProcessSettings
from kubemoot.store.nats import NatsKV
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import sources

pytestmark = pytest.mark.nats

HELLO = [{"role": "user", "content": "hi"}]
CHAT = {"model": "small:1b", "messages": HELLO, "stream": False}


@pytest.fixture
async def on_nats(nats: NatsServer, make_emulator: Callable[..., OllamaEmulator]
                  ) -> AsyncIterator[tuple[GatewayServer, NatsKV]]:
    # two reconnect rounds 0.1 s apart: the client gives up within a second or so
    kv = await NatsKV.connect(NatsSettings(servers=[nats.url], max_reconnect_attempts=2,
                                           reconnect_wait=0.1, request_timeout=1.0,
                                           connect_timeout=0.5))
    gateway = GatewayServer(
        kv, providers=sources({"gpu-a": make_emulator()}), port=0,
        settings=GatewaySettings(wait_limit_seconds=5.0, provider_probe_seconds=0.5),
        process=ProcessSettings(store_check_seconds=0.3), clock=SystemClock())
    await gateway.start()
    try:
        yield gateway, kv
    finally:
        await gateway.stop()
        await kv.close()


async def test_calls_are_503_while_the_store_is_gone_and_succeed_after(
        nats: NatsServer, on_nats: tuple[GatewayServer, NatsKV],
        caplog: pytest.LogCaptureFixture) -> None:
    gateway, kv = on_nats
    health = gateway.health
    assert health is not None
    caplog.set_level(logging.WARNING)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        assert (await http.post("/api/chat", json=CHAT)).status_code == 200

        await nats.stop()
        await wait_until(lambda: kv.connection.is_closed, timeout=60,
                         what="nats-py giving up on its connection")
        await wait_until(lambda: health.store_lost() is not None, timeout=60,
                         what="the gateway noticing the store is gone")
        refused = await http.post("/api/chat", json=CHAT,
                                  headers={"X-Kubemoot-Wait-Budget": "5"})
        assert refused.status_code == 503, refused.text
        # refused at the door, so no part of the budget went to store timeouts
        assert refused.json()["error"].startswith("the shared store does not answer")
        assert int(refused.headers["retry-after"]) >= 1
        openai = await http.post("/v1/chat/completions", json=CHAT)
        assert openai.status_code == 503
        assert openai.json()["error"]["code"] == "store_unavailable"
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["store"]["ok"] is False
        assert (await http.get("/healthz")).status_code == 200  # alive all along
        # said at WARNING, and not dropped by the CLI's filter of store-loss records
        said = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and StoreLossFilter().filter(r)]
        assert any("does not answer" in line for line in said), said
        assert any("gave up after 2 reconnect rounds" in line for line in said), said

        await nats.start()
        await wait_until(lambda: health.store_lost() is None, timeout=60,
                         what="the gateway finding the store again")
        for _ in range(2):  # and the second time
            again = await http.post("/api/chat", json=CHAT)
            assert again.status_code == 200, again.text
        assert (await http.get("/readyz")).status_code == 200
        assert kv.rebuilds == 1
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("answers again" in line for line in said), said

