"""Across processes: ``kubemoot dashboard --nats`` shows what another process writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.dashboard.calllog import CallLogWriter
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV, NatsSettings
from kubemoot.testing.nats_server import NatsServer
from tests.dashboard.conftest import call, state
from tests.dashboard.test_dashboard_cli import KUBEMOOT

pytestmark = pytest.mark.nats


@pytest.fixture
async def nats_url() -> AsyncIterator[str]:
    server = NatsServer()
    await server.start()
    try:
        yield server.url
    finally:
        await server.close()


async def test_dashboard_over_nats_shows_another_process(nats_url: str) -> None:
    dashboard = await asyncio.create_subprocess_exec(
        str(KUBEMOOT), "dashboard", "--nats", nats_url, "--port", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    assert dashboard.stderr is not None
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        async with asyncio.timeout(60):
            line = (await dashboard.stderr.readline()).decode()
            assert line.startswith("dashboard: http://127.0.0.1:"), line
            url = line.split()[1]
            states = await kv.bucket(PROVIDER_STATE_BUCKET)
            doc = state("rtx5090", loaded={"qwen3:32b": 27648}, probed=SystemClock().now())
            await states.put(encode_token("rtx5090"), doc.to_json())
            writer = await CallLogWriter.open(kv)
            await writer.publish(call("crew-a/kubectl-agent", 1, provider="rtx5090",
                                      model="qwen3:32b", evicted=("qwen3:8b",)))
            snapshot: dict[str, Any] = {}
            async with httpx.AsyncClient(base_url=url) as client:
                while not (snapshot.get("agents") and snapshot.get("providers")):
                    await asyncio.sleep(0.05)
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
