"""One parse per ticket-document revision, shared by the provider view and the capacity
watch; each still reacts to an unreadable document in its own way."""

from __future__ import annotations

import asyncio

from kubemoot.clock import ManualClock
from kubemoot.runtime.capacity import CapacityWatch
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.runtime.watching import ParsedDocuments
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, NOW, provider_state

PROVIDER = "gpu-a"


class _Counted:
    """The ticket parse, counting the revisions it was asked to parse."""

    def __init__(self) -> None:
        self.parsed: list[bytes] = []

    def __call__(self, value: bytes) -> ProviderTickets:
        self.parsed.append(value)
        return ProviderTickets.from_json(value)


async def _following(clock: ManualClock, *, primed: bool = False) -> tuple[
    MemoryKV, ProviderView, CapacityWatch, TicketManager, _Counted
]:
    kv = MemoryKV(clock=clock)
    states, tickets = await kv.bucket("states"), await kv.bucket("tickets")
    await states.put(encode_token(PROVIDER),
                     provider_state(PROVIDER, usable_mib=16 * GIB).to_json())
    parse = _Counted()
    shared = ParsedDocuments(parse)
    view = ProviderView(states, tickets, clock=clock, settings=RuntimeSettings(),
                        latency=LatencyTracker(), circuits=CircuitBreakers(clock=clock),
                        ticket_documents=shared)
    watch = CapacityWatch(states, tickets, clock=clock, documents=shared)
    await watch.start()
    assert await view.follow()
    await view.snapshot()
    manager = TicketManager(tickets, states, clock=clock, parsed=shared if primed else None)
    return kv, view, watch, manager, parse


async def test_each_revision_is_parsed_once_for_both_followers() -> None:
    clock = ManualClock(NOW)
    kv, view, watch, manager, parse = await _following(clock)
    seen = watch.counter
    first = await manager.claim(PROVIDER, "m", 4 * GIB, "one")
    seen = await watch.changed_since(seen, 5.0)
    second = await manager.claim(PROVIDER, "n", 2 * GIB, "two")
    seen = await watch.changed_since(seen, 5.0)
    await manager.release(PROVIDER, first.ticket_id)
    await watch.changed_since(seen, 5.0)
    await asyncio.sleep(0)  # the view's watch task files the last change too
    view.invalidate(None)  # and the view reads the document again: no parse for that
    p = (await view.snapshot()).provider(PROVIDER)
    assert p is not None and [t.ticket_id for t in p.tickets] == [second.ticket_id]
    # three writes, three parses: neither the view nor the watch parsed one again
    assert len(parse.parsed) == 3
    assert len(set(parse.parsed)) == 3
    await watch.close()
    await view.close()
    await kv.close()


async def test_an_unreadable_document_is_handled_by_each_follower_in_its_own_way() -> None:
    clock = ManualClock(NOW)
    kv, view, watch, manager, parse = await _following(clock)
    seen = watch.counter
    await manager.claim(PROVIDER, "m", 4 * GIB, "one")
    seen = await watch.changed_since(seen, 5.0)
    tickets = await kv.bucket("tickets")
    await tickets.put(encode_token(PROVIDER), b"{not json")
    await watch.changed_since(seen, 5.0)  # the watch saw it and kept its expiries
    assert watch._next_expiry() is not None
    await asyncio.sleep(0)
    p = (await view.snapshot()).provider(PROVIDER)
    assert p is not None and not p.state.ready  # the view shows the provider not ready
    assert p.state.reason == "its ticket document is unreadable"
    assert parse.parsed.count(b"{not json") == 1
    await watch.close()
    await view.close()
    await kv.close()


async def test_what_the_ticket_manager_writes_is_not_parsed_back() -> None:
    """Given the shared parses, the manager hands over each document it wrote: neither
    follower parses it, and what they read is what the stored bytes parse to."""
    clock = ManualClock(NOW)
    kv, view, watch, manager, parse = await _following(clock, primed=True)
    tickets = await kv.bucket("tickets")
    key = encode_token(PROVIDER)
    seen = watch.counter
    first = await manager.claim(PROVIDER, "m", 4 * GIB, "one")
    seen = await watch.changed_since(seen, 5.0)
    second = await manager.claim(PROVIDER, "n", 2 * GIB, "two", evicts={"old": GIB})
    seen = await watch.changed_since(seen, 5.0)
    await manager.release(PROVIDER, first.ticket_id)
    await watch.changed_since(seen, 5.0)
    await asyncio.sleep(0)
    view.invalidate(None)
    p = (await view.snapshot()).provider(PROVIDER)
    assert p is not None and [t.ticket_id for t in p.tickets] == [second.ticket_id]
    assert parse.parsed == []  # three writes, no parse
    stored = await tickets.get(key)
    assert stored is not None
    assert list(p.tickets) == ProviderTickets.from_json(stored.value).tickets
    await watch.close()
    await view.close()
    await kv.close()
