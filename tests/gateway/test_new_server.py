"""Fault 7 (issue 22): a model that a newly added server lists is placeable on every
replica within one probe interval.

Two gateway replicas share a real nats-server, each probing its own server. A third
server joins (its own replica publishes it, as a new gateway or the operator would) with
a model nobody else has; both existing replicas must place calls for it once its state
is published — not answer 404 for minutes.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings, NatsSettings
from kubemoot.store.nats import NatsKV
from kubemoot.store.protocol import KV
from kubemoot.testing.nats_server import NatsServer
from tests.gateway.conftest import SMALL, sources, start_gateway

pytestmark = pytest.mark.nats

FRESH = EmulatedModel("fresh:3b", 1500, family="fresh")
PROBE_SECONDS = 0.5


async def _replica(url: str, emulators: dict[str, OllamaEmulator]
                   ) -> tuple[GatewayServer, KV]:
    kv = await NatsKV.connect(NatsSettings(servers=[url]))
    gateway = GatewayServer(kv, providers=sources(emulators), port=0, clock=SystemClock(),
                            settings=GatewaySettings(wait_limit_seconds=5.0,
                                                     provider_probe_seconds=PROBE_SECONDS))
    await gateway.start()
    return gateway, kv


async def test_every_replica_places_a_model_a_new_server_lists(
        nats: NatsServer, make_emulator: Callable[..., OllamaEmulator]) -> None:
    started: list[tuple[GatewayServer, KV]] = []
    try:
        for name in ("gpu-a", "gpu-b"):
            started.append(await _replica(nats.url, {name: make_emulator(models=(SMALL,))}))
        clients = [httpx.AsyncClient(base_url=g.url, timeout=30) for g, _ in started]
        body = {"model": "fresh:3b", "stream": False,
                "messages": [{"role": "user", "content": "hi"}]}
        for http in clients:  # warm the replicas' catalogues: the model is unknown now
            assert (await http.post("/api/chat", json=body)).status_code == 404
            assert (await http.post("/api/chat", json={**body, "model": "small:1b"})
                    ).status_code == 200
        new = make_emulator(models=(FRESH,))
        started.append(await _replica(nats.url, {"gpu-new": new}))  # published at start
        for http in clients:
            tags = (await http.get("/api/tags")).json()["models"]
            assert "fresh:3b" in [t["name"] for t in tags]
            answer = await http.post("/api/chat", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-kubemoot-provider"] == "gpu-new"
        for http in clients:
            await http.aclose()
    finally:
        for gateway, kv in started:
            await gateway.stop()
            await kv.close()


async def test_replicas_on_nats_hand_contended_ticket_operations_to_a_combiner(
        nats: NatsServer, make_emulator: Callable[..., OllamaEmulator]) -> None:
    # Replicas sharing NATS race for the same provider's ticket document; with a bus,
    # the runtime sends the operations of a contended lane to the provider's combiner
    # (runtime/ticket_delegation.py) instead of racing again. An embedded gateway is
    # alone, so it gets none.
    gateway, kv = await _replica(nats.url, {"gpu-a": make_emulator(models=(SMALL,))})
    try:
        assert gateway.stack is not None
        assert gateway.stack.tickets.combines
    finally:
        await gateway.stop()
        await kv.close()
    alone = await start_gateway({"gpu-a": make_emulator(models=(SMALL,))})
    try:
        assert alone.stack is not None
        assert not alone.stack.tickets.combines
    finally:
        await alone.stop()
