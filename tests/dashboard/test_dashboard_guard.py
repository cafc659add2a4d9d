"""The dashboard's guard: Host header check, security headers, a cap on live pages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.dashboard.app import CONTENT_SECURITY_POLICY
from kubemoot.dashboard.server import DashboardServer
from kubemoot.settings import DashboardSettings
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import wait_until
from kubemoot.webguard import host_allowed
from tests.dashboard.test_dashboard_http import ROUTES


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:8765", True),
        ("localhost:8765", True),
        ("LOCALHOST", True),
        ("[::1]:8765", True),
        ("10.1.2.3:8765", True),          # an address cannot be rebound by a foreign page
        ("dashboard.example:8765", True),  # named with --allow-host
        ("attacker.example:8765", False),
        ("127.0.0.1.attacker.example", False),
        ("", False),
    ],
)
def test_host_header_table(host: str, allowed: bool) -> None:
    settings = DashboardSettings().allowing(["Dashboard.example "])
    assert host_allowed(host, allowed=settings.allowed_hosts) is allowed


@pytest.fixture
async def capped(live_kv: MemoryKV) -> AsyncIterator[DashboardServer]:
    settings = DashboardSettings(max_clients=1, allowed_hosts=("dashboard.example",))
    async with DashboardServer(live_kv, port=0, clock=SystemClock(),
                               settings=settings) as running:
        yield running


async def test_every_route_sends_the_security_headers(server: DashboardServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for route in ROUTES:
            async with client.stream("GET", route) as response:
                assert response.status_code == 200, route
                assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
                assert response.headers["x-frame-options"] == "DENY"
                assert response.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY


async def test_a_foreign_host_header_is_refused(capped: DashboardServer) -> None:
    async with httpx.AsyncClient(base_url=capped.url, timeout=30) as client:
        for route in ROUTES:
            refused = await client.get(route, headers={"Host": "attacker.example:8765"})
            assert refused.status_code == 403, route
            assert refused.headers["x-frame-options"] == "DENY"
        named = await client.get("/api/state", headers={"Host": "dashboard.example"})
        assert named.status_code == 200


async def test_live_pages_are_capped(capped: DashboardServer) -> None:
    async with httpx.AsyncClient(base_url=capped.url, timeout=30) as client:
        async with client.stream("GET", "/events") as first:
            assert first.status_code == 200
            async for line in first.aiter_lines():
                if line.startswith("data:"):
                    break  # the first page is being served
            second = await client.get("/events")
            assert second.status_code == 503
            assert "Retry-After" in second.headers
        # The first page went away: its place is free again once the server noticed the
        # closed connection, which it tells nobody; ask until a page is let in.
        async def let_in() -> bool:
            async with client.stream("GET", "/events") as third:
                return third.status_code == 200

        await wait_until(let_in, timeout=20, what="a page let in after the first left")
