"""A finished call's latency moves its provider's snapshot without rebuilding it.

Every call's release feeds its endpoint's latency average, so on a warm fleet every
snapshot after a call saw a latency change. The view built that provider again (its
live state, expiry, memory budget, free-copy entries) and the index moved it between
its lists, though none of that depends on the latency. Now the snapshot is copied with
the new latency and the index's lists are shared: these tests count the rebuilds, and
check that what the patched snapshot and index answer is what a full build answers.
"""

from __future__ import annotations

import asyncio

import pytest

from kubemoot.clock import ManualClock
from kubemoot.runtime import view as view_module
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.snapshot import FleetIndex, FleetSnapshot, ProviderSnapshot
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.runtime.watching import ParsedDocuments
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, NOW, provider_state

A, B = "gpu-a", "gpu-b"


async def _following(
    clock: ManualClock, latency: LatencyTracker
) -> tuple[MemoryKV, ProviderView, TicketManager]:
    kv = MemoryKV(clock=clock)
    states, tickets = await kv.bucket("states"), await kv.bucket("tickets")
    for name in (A, B):
        state = provider_state(name, usable_mib=16 * GIB, loaded={"m": 4 * GIB}, slots=4)
        await states.put(encode_token(name), state.to_json())
    # one parse of each ticket document for the view and the manager, as the runtime
    # builds them (builder.py): the view meets the manager's own ticket objects again
    documents = ParsedDocuments(ProviderTickets.from_json)
    view = ProviderView(states, tickets, clock=clock, settings=RuntimeSettings(),
                        latency=latency, ticket_documents=documents)
    assert await view.follow()
    return kv, view, TicketManager(tickets, states, clock=clock, parsed=documents)


class _Counted:
    """Counts the calls of the rebuild's parts while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.live_state = 0
        self.replaced = 0
        live_state, replaced = view_module.live_state, FleetIndex.replaced

        def counted_live_state(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.live_state += 1
            return live_state(*args, **kwargs)

        def counted_replaced(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.replaced += 1
            return replaced(*args, **kwargs)

        monkeypatch.setattr(view_module, "live_state", counted_live_state)
        monkeypatch.setattr(FleetIndex, "replaced", counted_replaced)


def _built_anew(fleet: FleetSnapshot) -> FleetSnapshot:
    """The same fleet built from nothing: each provider from its documents."""
    return FleetSnapshot.of(fleet.now, [
        ProviderSnapshot(q.state, q.tickets, q.latency_seconds, q.circuit_open)
        for q in fleet.providers
    ])


def _answers(fleet: FleetSnapshot) -> object:
    """What a placement asks of a fleet, as plain values."""
    index = fleet.index
    return (
        [(p.name, p.latency_seconds, p.free_mib, p.loading_mib, p.tickets, p.state,
          p.has_free_slot("m"), p.in_flight("m"), p.circuit_open)
         for p in fleet.providers],
        index.free_copies("m"),
        index.smallest_free_context("m"),
        [p.name for p in index.copies_of("m")],
        [p.name for p in index.with_room(0)],
    )


async def test_a_call_and_its_latency_rebuild_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock(NOW)
    latency = LatencyTracker()
    kv, view, manager = await _following(clock, latency)
    kept = await manager.claim(A, "m", 4 * GIB, "kept")  # a call that stays
    view.note_claimed(A, kept)
    before = await view.snapshot()
    counted = _Counted(monkeypatch)
    # a warm call: claimed, answered, released, and its latency observed
    ticket = await manager.claim(A, "m", 4 * GIB, "one")
    view.note_claimed(A, ticket)
    await manager.release(A, ticket.ticket_id)
    view.note_released(A, ticket.ticket_id)
    view.observe_latency(A, provider_state(A).endpoint, 2.5)
    await asyncio.sleep(0)  # the watch delivered both writes
    after = await view.snapshot()
    assert (counted.live_state, counted.replaced) == (0, 0)  # main: (1, 1)
    p = after.provider(A)
    assert p is not None and p.latency_seconds == 2.5
    assert after.index is not before.index
    assert after.index.changed == (p,)
    assert view.changed_since(before.index.generation) == frozenset({A})
    assert after.provider(B) is before.provider(B)
    assert _answers(after) == _answers(_built_anew(after))
    await view.close()
    await kv.close()


async def test_a_latency_beside_a_ticket_change_still_rebuilds() -> None:
    clock = ManualClock(NOW)
    latency = LatencyTracker()
    kv, view, manager = await _following(clock, latency)
    before = await view.snapshot()
    ticket = await manager.claim(A, "m", 4 * GIB, "stays")
    view.note_claimed(A, ticket)
    view.observe_latency(A, provider_state(A).endpoint, 3.0)
    await asyncio.sleep(0)
    after = await view.snapshot()
    p = after.provider(A)
    assert p is not None and p.latency_seconds == 3.0
    assert [t.ticket_id for t in p.tickets] == [ticket.ticket_id]
    assert after.index.free_copies("m") != before.index.free_copies("m")
    assert _answers(after) == _answers(_built_anew(after))
    await view.close()
    await kv.close()


def test_with_latency_changes_the_latency_alone() -> None:
    state = provider_state(A, usable_mib=16 * GIB, loaded={"m": 4 * GIB})
    p = ProviderSnapshot(state, (), 1.0)
    assert p.free_mib == 12 * GIB  # derived before the copy: carried over
    q = p.with_latency(7.0)
    assert q.latency_seconds == 7.0 and p.latency_seconds == 1.0
    assert q == ProviderSnapshot(state, (), 7.0)
    assert q.free_mib == p.free_mib and q.copies == p.copies
    with pytest.raises(AttributeError):
        q.latency_seconds = 2.0  # type: ignore[misc]
