"""Across processes: ``kubemoot dashboard --nats`` shows what another process writes,
and shows when the NATS server behind it goes away and comes back."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.dashboard.calllog import CallLogWriter
from kubemoot.settings import NatsSettings
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV
from kubemoot.testing.nats_server import NatsServer
from tests.dashboard.conftest import call, state
from tests.dashboard.test_dashboard_cli import KUBEMOOT
from tests.dashboard.test_dashboard_http import events

pytestmark = pytest.mark.nats


@pytest.fixture
def nats_server(nats: NatsServer) -> NatsServer:
    """The shared per-test nats-server (tests/conftest.py)."""
    return nats


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


async def announced_url(stderr: asyncio.StreamReader) -> str:
    """The page's URL from the dashboard's start-up line (after the connection lines)."""
    while True:
        line = (await stderr.readline()).decode()
        assert line, "the dashboard ended before it announced its page"
        if line.startswith("dashboard: "):
            assert line.startswith("dashboard: http://127.0.0.1:"), line
            return line.split()[1]


async def test_dashboard_over_nats_shows_another_process(nats_url: str) -> None:
    dashboard = await asyncio.create_subprocess_exec(
        str(KUBEMOOT), "dashboard", "--nats", nats_url, "--port", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    assert dashboard.stderr is not None
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        async with asyncio.timeout(60):
            url = await announced_url(dashboard.stderr)
            async with httpx.AsyncClient(base_url=url) as client:
                stream = events(client)  # the page's own news of each change
                assert not (await anext(stream))["providers"]
                states = await kv.bucket(PROVIDER_STATE_BUCKET)
                doc = state("rtx5090", loaded={"qwen3:32b": 27648},
                            probed=SystemClock().now())
                await states.put(encode_token("rtx5090"), doc.to_json())
                writer = await CallLogWriter.open(kv)
                await writer.publish(call("crew-a/kubectl-agent", 1, provider="rtx5090",
                                          model="qwen3:32b", evicted=("qwen3:8b",)))
                await _first(stream, lambda s: bool(s["agents"] and s["providers"]))
                await stream.aclose()
                snapshot = (await client.get("/api/state")).json()
    finally:
        await kv.close()
        dashboard.terminate()
        await dashboard.wait()
    [provider] = snapshot["providers"]
    assert (provider["provider"], provider["residentMiB"]) == ("rtx5090", 27648)
    [agent] = snapshot["agents"]
    assert agent["agent"] == "crew-a/kubectl-agent"
    assert (agent["recent"][0]["provider"], agent["recent"][0]["evicted"]) == (
        "rtx5090", ["qwen3:8b"])


async def test_a_lost_store_shows_on_the_page_and_fails_healthz_until_it_returns(
    nats_server: NatsServer,
) -> None:
    env = {**os.environ, "KUBEMOOT_STORE_CHECK_SECONDS": "0.5"}
    dashboard = await asyncio.create_subprocess_exec(
        str(KUBEMOOT), "dashboard", "--nats", nats_server.url, "--port", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
    )
    assert dashboard.stderr is not None
    try:
        async with asyncio.timeout(120):
            url = await announced_url(dashboard.stderr)
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                assert (await client.get("/healthz")).text == "ok"
                stream = events(client)
                assert (await anext(stream))["store"]["reachable"] is True

                await nats_server.stop()
                lost = await _first(stream, lambda s: not s["store"]["reachable"])
                assert lost["store"]["lostSince"] is not None and lost["store"]["reason"]
                health = await client.get("/healthz")
                assert health.status_code == 503
                assert "shared state unreachable" in health.text
                scraped = (await client.get("/metrics")).text
                assert "kubemoot_dashboard_store_up 0.0" in scraped

                await nats_server.start()
                # written while the dashboard may still be reconnecting: it must catch up
                kv = await NatsKV.connect(NatsSettings(servers=[nats_server.url]))
                try:
                    states = await kv.bucket(PROVIDER_STATE_BUCKET)
                    doc = state("rtx4090", probed=SystemClock().now())
                    await states.put(encode_token("rtx4090"), doc.to_json())
                finally:
                    await kv.close()
                back = await _first(stream, lambda s: s["store"]["reachable"]
                                    and bool(s["providers"]))
                assert [p["provider"] for p in back["providers"]] == ["rtx4090"]
                assert (await client.get("/healthz")).text == "ok"
                await stream.aclose()
    finally:
        dashboard.terminate()
        await dashboard.wait()


async def _first(stream: AsyncIterator[dict[str, Any]],
                 wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    async for snapshot in stream:
        if wanted(snapshot):
            return snapshot
    raise AssertionError("the event stream ended")
