"""The dashboard over HTTP: read-only routes, the live event stream, /metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubemoot import metrics
from kubemoot.clock import SystemClock
from kubemoot.dashboard.calllog import CallLogWriter
from kubemoot.dashboard.server import DEFAULT_HOST, DashboardServer
from kubemoot.runtime.calls import CallRecord
from kubemoot.runtime.tickets import ClaimRejected, TicketManager
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, PROVIDER_TICKETS_BUCKET
from kubemoot.store.memory import MemoryKV
from tests.dashboard.conftest import Writers, state

ROUTES = ["/", "/static/dashboard.js", "/static/dashboard.css", "/api/state", "/events",
          "/metrics", "/healthz"]


async def events(client: httpx.AsyncClient) -> AsyncIterator[dict[str, Any]]:
    async with client.stream("GET", "/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                yield json.loads(line.removeprefix("data:"))


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_dashboard_binds_loopback_by_default() -> None:
    assert DEFAULT_HOST == "127.0.0.1"


async def test_dashboard_serves_page_and_assets(server: DashboardServer) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=server.url) as client:
        page = await client.get("/")
        assert page.status_code == 200 and "Agent Summary" in page.text
        script = await client.get("/static/dashboard.js")
        assert script.status_code == 200 and "EventSource" in script.text
        assert (await client.get("/static/../app.py")).status_code == 404
        assert (await client.get("/static/other.js")).status_code == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_dashboard_has_no_write_endpoints(server: DashboardServer, method: str) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        for route in ROUTES:
            response = await client.request(method, route)
            assert response.status_code == 405, (method, route)


async def test_dashboard_event_stream_pushes_changes(
    server: DashboardServer, live_kv: MemoryKV
) -> None:
    writers = Writers(live_kv)
    writer = await CallLogWriter.open(live_kv)
    seen: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        stream = events(client)
        seen.append(await anext(stream))
        assert seen[0]["providers"] == [] and seen[0]["agents"] == []
        await writers.put_state(state("rtx5090", loaded={"qwen3:32b": 27648},
                                      probed=SystemClock().now()))
        # The runtime's own record type goes through the listener the demo registers.
        writer.record(CallRecord(
            thread_id="t-1", agent="crew/tooler", phase="mulling", model="qwen3:32b",
            provider="rtx5090", endpoint="http://x", action="unload", waited_seconds=1.5,
            evicted=("qwen3:8b",), started_at=SystemClock().now(), seconds=2.0, ok=True,
        ))
        async with asyncio.timeout(20):
            async for snapshot in stream:
                seen.append(snapshot)
                if snapshot["agents"] and snapshot["providers"]:
                    break
        await stream.aclose()
    last = seen[-1]
    assert last["version"] > seen[0]["version"]
    assert last["providers"][0]["residentMiB"] == 27648
    [agent] = last["agents"]
    assert agent["agent"] == "crew/tooler"
    assert agent["recent"][0]["provider"] == "rtx5090"
    assert agent["recent"][0]["evicted"] == ["qwen3:8b"]


async def test_dashboard_metrics_parse_and_count(
    server: DashboardServer, live_kv: MemoryKV
) -> None:
    clock = SystemClock()
    await Writers(live_kv).put_state(state("gpu-a", total=16384, probed=clock.now()))
    tickets = TicketManager(await live_kv.bucket(PROVIDER_TICKETS_BUCKET),
                            await live_kv.bucket(PROVIDER_STATE_BUCKET), clock=clock)
    granted = sample("kubemoot_ticket_claims_total", result="granted")
    rejected = sample("kubemoot_ticket_claims_total", result="rejected")
    held = await tickets.claim("gpu-a", "qwen3:8b", 6144, "crew/a")
    with pytest.raises(ClaimRejected):
        await tickets.claim("gpu-a", "qwen3:32b", 27648, "crew/b")  # over the budget
    assert sample("kubemoot_ticket_claims_total", result="granted") == granted + 1
    assert sample("kubemoot_ticket_claims_total", result="rejected") == rejected + 1

    async with httpx.AsyncClient(base_url=server.url) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    for name in ("kubemoot_placement_seconds", "kubemoot_placement_decisions",
                 "kubemoot_ticket_claims", "kubemoot_ticket_cas_conflicts",
                 "kubemoot_evictions", "kubemoot_capacity_waits",
                 "kubemoot_capacity_wait_seconds", "kubemoot_refusals",
                 "kubemoot_probe_errors", "kubemoot_reconciles",
                 "kubemoot_provider_ready", "kubemoot_provider_vram_mib",
                 "kubemoot_active_tickets", "kubemoot_dashboard_clients"):
        assert name in families, name
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in families.values() for s in f.samples}
    assert values[("kubemoot_ticket_claims_total", (("result", "granted"),))] >= 1
    assert values[("kubemoot_provider_ready", (("provider", "gpu-a"),))] == 1.0
    assert values[("kubemoot_provider_vram_mib", (("provider", "gpu-a"), ("use", "loading")))] \
        == 6144.0
    assert values[("kubemoot_active_tickets", (("provider", "gpu-a"), ("state", "running")))] \
        == 1.0
    await tickets.release("gpu-a", held.ticket_id)
