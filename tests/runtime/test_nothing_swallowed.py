"""Faults of the shared state are logged and counted, and never read as free memory."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from kubemoot import metrics
from kubemoot.runtime.held_plans import HeldPlans
from kubemoot.runtime.placement import Action
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import StoreUnavailable
from kubemoot.testing.state import gpu, ticket
from tests.runtime.builders import candidates


def _count(site: str, kind: str) -> float:
    labels = {"component": "runtime", "operation": site, "kind": kind}
    value = metrics.REGISTRY.get_sample_value("kubemoot_errors_survived_total", labels)
    return 0.0 if value is None else value


async def test_an_unreadable_ticket_document_is_never_free_memory(
    make, caplog: pytest.LogCaptureFixture
) -> None:
    # Card b is free by its state, but its ticket document cannot be read: whatever it
    # held is unknown, so nothing is placed there.
    h = await make([gpu("a", 16, residents={"x": 14}), gpu("b", 24)], declared={"m": 12},
                   tickets={"a": [ticket("x")]})
    await h.tickets_bucket.put(encode_token("b"), b'{"tickets": [{"ticketId": 5}]}')
    h.view.invalidate()
    before = _count("tickets", "unreadable")
    with caplog.at_level(logging.WARNING):
        placed = await h.place("m")
    assert placed.action is Action.WAIT
    assert _count("tickets", "unreadable") > before
    assert "ticket document" in caplog.text and "unreadable" in caplog.text
    assert placed.decision is not None
    assert "unreadable" in str(placed.decision.to_dict())

    # Once the document reads again, the card is used.
    await h.set_tickets("b", [])
    placed = await h.place("m")
    assert (placed.action, placed.provider) == (Action.COLD_LOAD, "b")


async def test_an_unreadable_provider_state_is_logged_and_counted(
    make, caplog: pytest.LogCaptureFixture
) -> None:
    h = await make([gpu("a", 24)], declared={"m": 12})
    await h.states.put(encode_token("b"), b"not json")
    h.view.invalidate()
    before = _count("provider-state", "unreadable")
    with caplog.at_level(logging.WARNING):
        fleet = await h.view.snapshot()
    assert [p.name for p in fleet.providers] == ["a"]
    assert _count("provider-state", "unreadable") > before
    assert "provider state" in caplog.text


class _DownBoard:
    async def add_intent(self, model: str, agent: str) -> None:
        raise StoreUnavailable("no store")

    async def remove_intent(self, model: str, agent: str) -> None:
        raise StoreUnavailable("no store")

    async def record_selection(self, agent: str, models: Sequence[str], frequency: float) -> None:
        raise StoreUnavailable("no store")


async def test_a_failed_intent_write_is_logged_and_counted_and_the_plan_goes_on(
    make, caplog: pytest.LogCaptureFixture
) -> None:
    h = await make([gpu("a", 24)], declared={"m": 12})
    plans = HeldPlans(h.planner, clock=h.clock, board=_DownBoard())
    before = _count("intent", "store")
    selections = _count("selection", "store")
    with caplog.at_level(logging.WARNING):
        placed = await plans.commit_to_thread("crew/a", "t1", candidates("m"))
        await plans.release("crew/a", "t1")
    assert placed.ticket is not None
    assert _count("intent", "store") == before + 2
    assert "intents of crew/a" in caplog.text
    assert _count("selection", "store") == selections + 1  # its share, not written
    assert "selection of crew/a" in caplog.text


async def test_an_unreadable_ticket_document_fails_a_claim_loudly(
    make, caplog: pytest.LogCaptureFixture
) -> None:
    h = await make([gpu("a", 24)])
    await h.tickets_bucket.put(encode_token("a"), b"garbage")
    before = _count("tickets", "unreadable")
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError):
        await h.tickets.claim("a", "m", 1024, "me")
    assert _count("tickets", "unreadable") > before
