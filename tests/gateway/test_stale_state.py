"""A replica without providers of its own, once the replica that probes them stops.

Gateway A serves and probes a card; gateway B shares A's NATS and has no providers: it
places on the states A publishes. When A stops, its last state stays in the bucket,
``ready`` with its copies. B must not go on placing calls against a state nobody
refreshes (a cold load priced on minutes-old memory, as if the card were known to be
up): past the freshness limit its readiness gate is STALE, ``/readyz`` says so, a call
waits for a fresh probe within its budget and is then refused with the provider and
the state's age, and a call still waiting when a prober comes back is placed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.runtime.freshness import MISSED_PROBES
from kubemoot.settings import GatewaySettings, NatsSettings, RuntimeSettings
from kubemoot.store.memory import MemoryKV
from kubemoot.store.nats import NatsKV
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import sources

CHAT = {"model": "small:1b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
PROBE_SECONDS = 0.5
#: B's probe timeout, the last term of its freshness limit (short, so the test is).
PROBE_TIMEOUT = 0.5
LIMIT = (MISSED_PROBES + 1) * PROBE_SECONDS + PROBE_TIMEOUT


async def _prober(nats: NatsServer, emulator: OllamaEmulator) -> tuple[GatewayServer, NatsKV]:
    kv = await NatsKV.connect(NatsSettings(servers=[nats.url]))
    gateway = GatewayServer(
        kv, providers=sources({"gpu-a": emulator}), port=0, clock=SystemClock(),
        settings=GatewaySettings(wait_limit_seconds=5.0, provider_probe_seconds=PROBE_SECONDS))
    await gateway.start()
    return gateway, kv


@pytest.mark.nats
async def test_a_state_nobody_refreshes_is_stale_not_ready(
        nats: NatsServer, make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator()
    a, a_kv = await _prober(nats, emulator)
    b_kv = await NatsKV.connect(NatsSettings(servers=[nats.url]))
    b = GatewayServer(b_kv, providers=[], port=0, clock=SystemClock(),
                      settings=GatewaySettings(wait_limit_seconds=5.0),
                      runtime=RuntimeSettings(probe_timeout_seconds=PROBE_TIMEOUT))
    await b.start()
    a_stopped = False
    try:
        async with httpx.AsyncClient(base_url=b.url, timeout=60) as http:
            first = await http.post("/api/chat", json=CHAT)
            assert first.status_code == 200, first.text
            assert first.headers["x-kubemoot-provider"] == "gpu-a"

            await a.stop()  # its last state stays in the bucket, ready
            await a_kv.close()
            a_stopped = True

            async def unready() -> bool:
                return (await http.get("/readyz")).status_code == 503

            await wait_until(unready, timeout=30, what="B's /readyz giving up on gpu-a")
            ready = (await http.get("/readyz")).json()
            assert ready["checks"]["providers"]["ok"] is False, ready

            budget = {"X-Kubemoot-Wait-Budget": "0.5"}
            refused = await http.post("/api/chat", json=CHAT, headers=budget)
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["retry-after"]) >= 1
            message = refused.json()["error"]
            assert "gpu-a last probed" in message, message
            assert f"(limit {LIMIT:.0f} s)" in message, message
            age = float(message.split("gpu-a last probed ")[1].split(" s ago")[0])
            assert age >= LIMIT - 1, message  # rounded to whole seconds
            openai = await http.post("/v1/chat/completions", json=CHAT, headers=budget)
            assert openai.status_code == 503
            assert openai.json()["error"]["code"] == "provider_state_stale"

            # A call that waits is placed as soon as a prober publishes again.
            waiting = asyncio.ensure_future(http.post(
                "/api/chat", json=CHAT, headers={"X-Kubemoot-Wait-Budget": "60"}))
            assert b.stack is not None
            waiter = b.stack.calls.waiter
            await wait_until(lambda: waiter.waiting_for("small:1b") == 1, timeout=30,
                             what="the call waiting for a fresh state")
            assert not waiting.done()
            a, a_kv = await _prober(nats, emulator)
            a_stopped = False
            placed = await waiting
            assert placed.status_code == 200, placed.text
            assert placed.headers["x-kubemoot-provider"] == "gpu-a"
    finally:
        await b.stop()
        await b_kv.close()
        if not a_stopped:
            await a.stop()
            await a_kv.close()


async def test_a_reload_that_changes_the_probe_interval_publishes_the_new_promise(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    # readers judge the state by the interval it carries: a longer interval published
    # late would make them call a state stale that is only on its new schedule
    emulator = make_emulator()
    [source] = sources({"gpu-a": emulator})
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=[source], port=0,
                            settings=GatewaySettings(provider_probe_seconds=3600.0))
    await gateway.start()
    try:
        assert gateway.prober is not None
        assert gateway.prober.last_states["gpu-a"].probe_interval_seconds == 3600.0
        said = await gateway.reconfigure(
            providers=[source], declared={},
            settings=GatewaySettings(provider_probe_seconds=7200.0))
        assert said == ["limits"]
        [state] = await gateway.prober.probe_all()
        assert state.probe_interval_seconds == 7200.0
    finally:
        await gateway.stop()
