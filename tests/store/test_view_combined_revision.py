"""A claim or release the provider's combiner wrote for this process is not undone in
its view by an older watch delivery.

The view notes this process's own claims and releases, and skips watch deliveries older
than the revision its note stands on. When the combiner (another process) writes the
operation, this process has no copy of that revision: the combiner's answer carries it.
Without it the note stood on an older revision, and a delivery from before the write
hid the new ticket, or showed a released one as still held, until the next delivery.

As in test_view_noted_revision.py, the store, the bus and the revisions are real
(embedded and a real NATS server); only the moment each change reaches the view is the
test's.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.runtime.watching import ParsedDocuments
from kubemoot.settings import RuntimeSettings
from kubemoot.store.bus import Bus, MemoryBus
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV
from kubemoot.store.natsbus import NatsBus
from kubemoot.testing.state import GIB
from kubemoot.testing.waiting import until_stored
from tests.store.conftest import StoreUnderTest
from tests.store.test_claim_line import LosingBucket, LosingOnce, Shared, shared
from tests.store.test_tickets import PROVIDER
from tests.store.test_view_noted_revision import _HeldBucket, _HeldWatch, _passed

__all__ = ["shared"]  # the fixture, used by name below


@dataclass
class _Combined:
    view: ProviderView
    watch: _HeldWatch
    combiner: TicketManager  # another process, combining for the provider
    sender: TicketManager  # this process: its races lose, its operations go to the combiner
    shared: Shared


async def _followed_view(shared: Shared) -> tuple[ParsedDocuments[ProviderTickets],
                                                  ProviderView, _HeldWatch]:
    """This process's view, following the tickets through a watch the test releases
    change by change, and the parse cache it shares with the process's ticket manager
    (as the builder makes them)."""
    parsed = ParsedDocuments(ProviderTickets.from_json)
    held = _HeldBucket(shared.tickets)
    view = ProviderView(shared.states, held, clock=shared.clock,  # type: ignore[arg-type]
                        settings=RuntimeSettings(), latency=LatencyTracker(),
                        ticket_documents=parsed)
    assert await view.follow()
    await view.snapshot()
    (watch,) = held.watches
    return parsed, view, watch


@pytest.fixture
async def combined(shared: Shared, store: StoreUnderTest) -> AsyncIterator[_Combined]:
    bus: Bus = NatsBus(store.kv) if isinstance(store.kv, NatsKV) else MemoryBus()  # type: ignore[assignment]
    lined = Shared(shared.tickets, shared.states, shared.requests, shared.clock, bus)
    parsed, view, watch = await _followed_view(shared)
    combiner = lined.manager(1, tickets=LosingOnce(shared.tickets))  # type: ignore[arg-type]
    sender = TicketManager(LosingBucket(shared.tickets), shared.states,  # type: ignore[arg-type]
                           clock=shared.clock, rng=random.Random(2), max_attempts=40,
                           requests=shared.requests, request_seconds=60, bus=bus,
                           parsed=parsed)
    assert await combiner.open() and await sender.open()
    # The other process lost a race once and found nobody combining: it combines now.
    await combiner.claim(PROVIDER, "m", 1 * GIB, "combiner")
    yield _Combined(view, watch, combiner, sender, lined)
    await view.close()
    await sender.aclose()
    await combiner.aclose()
    if isinstance(bus, MemoryBus):
        await bus.close()


async def _shown(view: ProviderView) -> list[str]:
    provider = (await view.snapshot()).provider(PROVIDER)
    assert provider is not None
    return sorted(t.ticket_id for t in provider.tickets)


async def _newest(shared: Shared) -> int:
    entry = await shared.tickets.get(encode_token(PROVIDER))
    assert entry is not None
    return entry.revision


async def test_an_older_delivery_does_not_hide_the_ticket_the_combiner_granted(
        combined: _Combined) -> None:
    view, watch, sender = combined.view, combined.watch, combined.sender
    ticket = await asyncio.wait_for(sender.claim(PROVIDER, "m", 2 * GIB, "ours"), 30)
    assert sender.combined == 1  # the combiner wrote it, not this process
    granted = await _newest(combined.shared)
    view.note_claimed(PROVIDER, ticket)
    assert ticket.ticket_id in await _shown(view)
    # Every revision from before the grant reaches the view now: none hides the ticket.
    while not watch.passed or watch.passed[-1].revision < granted:
        await _passed(watch, len(watch.passed) + 1)
        assert ticket.ticket_id in await _shown(view), watch.passed[-1].revision


async def test_the_grants_delivery_after_the_release_does_not_show_the_call_running(
        combined: _Combined) -> None:
    view, watch, sender = combined.view, combined.watch, combined.sender
    ticket = await asyncio.wait_for(sender.claim(PROVIDER, "m", 2 * GIB, "ours"), 30)
    view.note_claimed(PROVIDER, ticket)
    await asyncio.wait_for(sender.release(PROVIDER, ticket.ticket_id), 30)
    assert sender.combined == 2  # the release went to the combiner too
    released = await _newest(combined.shared)
    view.note_released(PROVIDER, ticket.ticket_id)
    assert ticket.ticket_id not in await _shown(view)
    # The grant's write and everything before the release reach the view only now.
    while not watch.passed or watch.passed[-1].revision < released:
        await _passed(watch, len(watch.passed) + 1)
        assert ticket.ticket_id not in await _shown(view), watch.passed[-1].revision


async def test_a_claim_another_writer_applied_from_the_line_is_not_hidden(
        shared: Shared) -> None:
    # No combiner: this process's claim loses every race and is announced; another
    # process's write applies it. That revision is not this process's either: the
    # lane answers the claim off the document that shows it and makes its revision known.
    parsed, view, watch = await _followed_view(shared)
    sender = TicketManager(LosingBucket(shared.tickets), shared.states,  # type: ignore[arg-type]
                           clock=shared.clock, rng=random.Random(1), max_attempts=40,
                           requests=shared.requests, request_seconds=60, parsed=parsed)
    writer = shared.manager(2)
    assert await sender.open() and await writer.open()
    claiming = asyncio.create_task(sender.claim(PROVIDER, "m", 2 * GIB, "ours"))
    await until_stored(shared.requests, lambda: writer.announced(PROVIDER), timeout=30,
                       what="the claim announced and seen by the other process")
    await writer.claim(PROVIDER, "m", 1 * GIB, "theirs")  # its write applies ours too
    ticket = await asyncio.wait_for(claiming, 30)
    applied = await _newest(shared)
    view.note_claimed(PROVIDER, ticket)
    assert ticket.ticket_id in await _shown(view)
    while not watch.passed or watch.passed[-1].revision < applied:
        await _passed(watch, len(watch.passed) + 1)
        assert ticket.ticket_id in await _shown(view), watch.passed[-1].revision
    await view.close()
    await sender.aclose()
    await writer.aclose()
