"""A provider whose live tickets came back to what its snapshot shows keeps that snapshot.

A call placed and released between two snapshots (one agent calling after another on a
quiet fleet) writes two ticket documents, and the second holds the tickets the first
replaced. The view then keeps the provider's snapshot and the fleet index as they were,
instead of building both again for a provider that did not change.
"""

from __future__ import annotations

import asyncio

from kubemoot.clock import ManualClock
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import RuntimeSettings
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, NOW, provider_state

PROVIDER = "gpu-a"


async def _following(clock: ManualClock) -> tuple[MemoryKV, ProviderView, TicketManager]:
    kv = MemoryKV(clock=clock)
    states, tickets = await kv.bucket("states"), await kv.bucket("tickets")
    await states.put(encode_token(PROVIDER),
                     provider_state(PROVIDER, usable_mib=16 * GIB).to_json())
    view = ProviderView(states, tickets, clock=clock, settings=RuntimeSettings(),
                        latency=LatencyTracker())
    assert await view.follow()
    return kv, view, TicketManager(tickets, states, clock=clock)


async def test_a_claim_and_its_release_between_two_snapshots_keep_the_index() -> None:
    clock = ManualClock(NOW)
    kv, view, manager = await _following(clock)
    kept = await manager.claim(PROVIDER, "m", 2 * GIB, "kept")  # a call that stays
    view.note_claimed(PROVIDER, kept)
    before = await view.snapshot()
    ticket = await manager.claim(PROVIDER, "n", 4 * GIB, "one")
    view.note_claimed(PROVIDER, ticket)
    await manager.release(PROVIDER, ticket.ticket_id)
    view.note_released(PROVIDER, ticket.ticket_id)
    await asyncio.sleep(0)  # the watch delivered both writes
    after = await view.snapshot()
    assert after.index is before.index
    assert after.provider(PROVIDER) is before.provider(PROVIDER)
    await view.close()
    await kv.close()


async def test_a_ticket_that_stays_is_shown_and_its_release_after_it() -> None:
    clock = ManualClock(NOW)
    kv, view, manager = await _following(clock)
    empty = await view.snapshot()
    ticket = await manager.claim(PROVIDER, "m", 4 * GIB, "one")
    view.note_claimed(PROVIDER, ticket)
    await asyncio.sleep(0)
    held = await view.snapshot()
    assert held.index is not empty.index
    p = held.provider(PROVIDER)
    assert p is not None and [t.ticket_id for t in p.tickets] == [ticket.ticket_id]
    await manager.release(PROVIDER, ticket.ticket_id)
    view.note_released(PROVIDER, ticket.ticket_id)
    await asyncio.sleep(0)
    released = await view.snapshot()
    assert released.index is not held.index  # the release is a change from ``held``
    p = released.provider(PROVIDER)
    assert p is not None and p.tickets == () and p.free_mib == 16 * GIB
    await view.close()
    await kv.close()


async def test_the_kept_snapshot_still_lapses_when_its_tickets_expire() -> None:
    clock = ManualClock(NOW)
    kv, view, manager = await _following(clock)
    kept = await manager.claim(PROVIDER, "m", 2 * GIB, "kept")
    view.note_claimed(PROVIDER, kept)
    before = await view.snapshot()
    ticket = await manager.claim(PROVIDER, "n", 4 * GIB, "one")
    view.note_claimed(PROVIDER, ticket)
    await manager.release(PROVIDER, ticket.ticket_id)
    view.note_released(PROVIDER, ticket.ticket_id)
    await asyncio.sleep(0)
    assert (await view.snapshot()).index is before.index
    clock.advance(kept.expires_at - clock.now() + 1)  # the kept call's ticket lapsed
    p = (await view.snapshot()).provider(PROVIDER)
    assert p is not None and p.tickets == () and p.free_mib == 16 * GIB
    await view.close()
    await kv.close()
