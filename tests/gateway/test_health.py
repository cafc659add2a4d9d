"""Item 8 and 12 (issue 22): /healthz, /readyz, /api/kubemoot/providers, the access log
and the per-server metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings
from kubemoot.testing.nats_server import free_port
from tests.gateway.conftest import Fleet, start_gateway

HELLO = [{"role": "user", "content": "hi"}]


async def test_alive_and_ready_with_a_ready_provider(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        assert (await http.get("/healthz")).json() == {"status": "alive"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        checks = ready.json()["checks"]
        assert checks["store"]["ok"] and checks["inference"]["ok"]
        assert checks["providers"]["ready"] == ["gpu-a", "gpu-b"]


@pytest.fixture
async def nobody(make_emulator: Callable[..., OllamaEmulator]) -> AsyncIterator[GatewayServer]:
    from kubemoot.clock import SystemClock
    from kubemoot.gateway import ProviderSource
    from kubemoot.store.memory import MemoryKV

    dead = ProviderSource("gpu-gone", f"http://127.0.0.1:{free_port()}", total_vram_mib=8192)
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=[dead], port=0,
                            settings=GatewaySettings(wait_limit_seconds=1.0))
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def test_not_ready_without_a_ready_provider_but_still_alive(
        nobody: GatewayServer) -> None:
    async with httpx.AsyncClient(base_url=nobody.url) as http:
        assert (await http.get("/healthz")).status_code == 200
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["providers"] == {"ok": False, "ready": [], "known": 1}


@pytest.fixture
async def one(make_emulator: Callable[..., OllamaEmulator]
              ) -> AsyncIterator[tuple[GatewayServer, OllamaEmulator]]:
    emulator = make_emulator()
    gateway = await start_gateway({"gpu-a": emulator}, settings=GatewaySettings(
        wait_limit_seconds=5.0, unready_after_failures=2))
    try:
        yield gateway, emulator
    finally:
        await gateway.stop()


async def test_readiness_follows_the_inference_path(
        one: tuple[GatewayServer, OllamaEmulator]) -> None:
    """The process is alive and the provider probes fine, but its calls fail: not ready;
    one call that succeeds makes it ready again."""
    gateway, emulator = one
    body = {"model": "small:1b", "messages": HELLO, "stream": False}
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        assert (await http.post("/api/chat", json=body)).status_code == 200
        emulator.fail_next(500, count=2, path="/api/chat")
        for _ in range(2):
            assert (await http.post("/api/chat", json=body)).status_code == 502
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        inference = ready.json()["checks"]["inference"]
        assert inference["ok"] is False and inference["failuresInARow"] == 2
        assert inference["lastStatus"] == 502
        assert (await http.post("/api/chat", json=body)).status_code == 200
        assert (await http.get("/readyz")).status_code == 200


async def test_providers_page_shows_each_server(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        answer = await http.post("/api/chat", json={"model": "small:1b", "messages": HELLO,
                                                    "stream": False})
        where = answer.headers["x-kubemoot-provider"]
        page = (await http.get("/api/kubemoot/providers")).json()
    servers = {p["provider"]: p for p in page["providers"]}
    assert set(servers) == {"gpu-a", "gpu-b"}
    held = servers[where]
    assert held["ready"] is True and held["circuit"] == "closed"
    assert held["lastProbedAt"] is not None and held["probeAgeSeconds"] >= 0
    copy = next(c for c in held["copies"] if c["name"] == "small:1b")
    assert copy["expiresAt"] is not None and copy["sizeMiB"] > 0
    assert held["tickets"] == []  # the call is over: its ticket is back
    assert held["queue"]["small:1b"] == {"inFlight": 0, "slots": 2, "queued": 0}
    assert held["usableMiB"] == 8192 - 512


async def test_one_access_line_per_call_and_per_server_metrics(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kubemoot.gateway.access")
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        answer = await http.post("/api/chat", json={"model": "small:1b", "messages": HELLO,
                                                    "stream": True})
        assert answer.status_code == 200
        provider = answer.headers["x-kubemoot-provider"]
        await http.get("/healthz")  # probes are not logged
        text = (await http.get("/metrics")).text
    lines = [r.getMessage() for r in caplog.records if r.name == "kubemoot.gateway.access"]
    calls = [line for line in lines if "POST /api/chat" in line]
    assert len(calls) == 1, lines
    assert f"provider={provider} model=small:1b" in calls[0]
    assert calls[0].startswith("127.0.0.1 anonymous POST /api/chat 200 ")
    assert "first_byte=" in calls[0] and "tokens=" in calls[0]
    assert not any("/healthz" in line for line in lines)
    for series in (f'kubemoot_gateway_calls_total{{provider="{provider}",route="/api/chat",'
                   'status="200"}',
                   f'kubemoot_gateway_first_token_seconds_count{{provider="{provider}"}}',
                   f'kubemoot_gateway_call_seconds_count{{provider="{provider}"}}',
                   f'kubemoot_gateway_tokens_total{{kind="completion",provider="{provider}"}}',
                   f'kubemoot_gateway_queue_depth{{model="small:1b",provider="{provider}"}}'):
        assert series in text, series


async def test_probes_need_no_key_but_the_providers_page_does(keyed: Fleet) -> None:
    async with httpx.AsyncClient(base_url=keyed.url) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200
        assert (await http.get("/api/kubemoot/providers")).status_code == 401
        page = await http.get("/api/kubemoot/providers",
                              headers={"Authorization": "Bearer sk-alice-secret"})
        assert page.status_code == 200
        assert [p["provider"] for p in page.json()["providers"]] == ["gpu-a"]


def test_cli_log_level_must_be_a_level() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "from kubemoot.cli import main; main()",
                           "gateway", "--provider", "http://127.0.0.1:1", "--log-level",
                           "loud"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--log-level" in done.stderr and "Traceback" not in done.stderr
