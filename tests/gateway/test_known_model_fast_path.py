"""A call to a model the gateway has seen builds no fleet snapshot of the gateway's own:
the planner builds the one the placement needs (every call's ticket makes the previous
one stale, so a second build per call was pure cost). A name it has not seen still
takes the snapshot, and is still told apart from a typo."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import httpx
import pytest

from kubemoot.runtime.snapshot import FleetSnapshot
from tests.gateway.conftest import Fleet

BODY = {"stream": False, "messages": [{"role": "user", "content": "hi"}]}


def _count_snapshots_from(fleet: Fleet, monkeypatch: pytest.MonkeyPatch,
                          function: str) -> list[str]:
    """Record each fleet snapshot that ``function`` of the gateway asks for."""
    assert fleet.gateway.desk is not None
    view = fleet.gateway.desk.runtime.view
    taken: list[str] = []
    original: Callable[[], Awaitable[FleetSnapshot]] = view.snapshot

    async def counted() -> FleetSnapshot:
        if sys._getframe(1).f_code.co_name == function:
            taken.append(function)
        return await original()

    monkeypatch.setattr(view, "snapshot", counted)
    return taken


@pytest.fixture
def fleet(quiet_card: Fleet) -> Fleet:
    """One card, probed at start-up only (conftest's quiet_card)."""
    return quiet_card


async def test_a_seen_model_is_placed_without_a_snapshot_of_the_gateways_own(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as http:
        first = await http.post("/api/chat", json={**BODY, "model": "small:1b"})
        assert first.status_code == 200, first.text
        # the load's own re-probe publishes a new state; a state change not yet applied
        # rightly sends the next call through the snapshot, so let it land first
        await asyncio.sleep(0.3)
        assert fleet.gateway.desk is not None
        await fleet.gateway.desk.runtime.view.snapshot()
        taken = _count_snapshots_from(fleet, monkeypatch, "_candidates")
        for _ in range(3):
            again = await http.post("/api/chat", json={**BODY, "model": "small:1b"})
            assert again.status_code == 200, again.text
        assert taken == []
        # a name nobody offers still looks at the fleet, and is still a 404
        typo = await http.post("/api/chat", json={**BODY, "model": "smal:1b"})
        assert typo.status_code == 404, typo.text
        assert taken == ["_candidates"]
