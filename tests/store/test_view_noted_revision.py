"""A watch delivery older than this process's own noted write does not undo the note.

The provider view notes its own claims and releases without reading the document
again. Its watch may deliver an older revision after that: the claim's own write when
the release was noted before it came, or another writer's revision from before the
claim. Applied over the note, the first showed a finished call as still running, the
second hid the call's new ticket, each until the next delivery.

The interleaving is made certain by holding the view's ticket watch: the store and its
revisions are real (embedded and a real NATS server), only the moment each change
reaches the view is the test's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.runtime.watching import ParsedDocuments
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, Change, Watch
from kubemoot.testing.state import GIB, provider_state
from tests.store.conftest import StoreUnderTest

PROVIDER = "gpu-a"


class _HeldWatch:
    """A real watch whose changes pass only as many as the test lets through."""

    def __init__(self, inner: Watch) -> None:
        self._inner = inner
        self._allowed = 0
        self.passed: list[Change] = []
        self._more = asyncio.Event()

    def let_through(self, count: int = 1) -> None:
        self._allowed += count
        self._more.set()

    def __aiter__(self) -> _HeldWatch:
        return self

    async def __anext__(self) -> Change:
        while len(self.passed) >= self._allowed:
            self._more.clear()
            await self._more.wait()
        change = await self._inner.__anext__()
        # the view's watch task files it in this same step, before anyone else runs
        self.passed.append(change)
        return change

    async def received(self, count: int) -> None:
        """Until the store has pushed this watch ``count`` changes, passed or held: a
        bucket keeps one revision a key, so a revision the watch was not yet sent may
        be passed over once the key is written again."""
        async with asyncio.timeout(10):
            while len(self.passed) + len(self._inner._pending) < count:  # type: ignore[attr-defined]
                await asyncio.sleep(0.001)

    def drain(self) -> list[Change] | None:
        raise NotImplementedError  # the view reads its watches by iterating

    async def ready(self) -> None:
        await self._inner.ready()

    async def aclose(self) -> None:
        self._more.set()
        await self._inner.aclose()


class _HeldBucket:
    """The ticket bucket as the view sees it: every read as is, its watch held."""

    def __init__(self, inner: Bucket) -> None:
        self._inner = inner
        self.watches: list[_HeldWatch] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def watch(self) -> _HeldWatch:
        held = _HeldWatch(self._inner.watch())
        self.watches.append(held)
        return held


async def _passed(watch: _HeldWatch, count: int) -> list[Change]:
    watch.let_through(count - len(watch.passed))
    async with asyncio.timeout(10):
        while len(watch.passed) < count:
            await asyncio.sleep(0.001)
    return watch.passed


async def _following(
    store: StoreUnderTest,
) -> tuple[ProviderView, _HeldWatch, TicketManager, Bucket, Bucket]:
    states, tickets = await store.bucket("states"), await store.bucket("tickets")
    await states.put(encode_token(PROVIDER),
                     provider_state(PROVIDER, usable_mib=16 * GIB).to_json())
    # one parse cache for the view and the ticket manager, as the runtime builder makes
    shared = ParsedDocuments(ProviderTickets.from_json)
    held = _HeldBucket(tickets)
    view = ProviderView(states, held, clock=store.clock,  # type: ignore[arg-type]
                        settings=RuntimeSettings(), latency=LatencyTracker(),
                        ticket_documents=shared)
    assert await view.follow()
    await view.snapshot()
    (watch,) = held.watches
    manager = TicketManager(tickets, states, clock=store.clock, parsed=shared)
    return view, watch, manager, states, tickets


async def _shown(view: ProviderView) -> list[str]:
    provider = (await view.snapshot()).provider(PROVIDER)
    assert provider is not None
    return sorted(t.ticket_id for t in provider.tickets)


async def test_the_claims_delivery_after_its_release_does_not_show_the_call_running(
    store: StoreUnderTest,
) -> None:
    view, watch, manager, _states, _tickets = await _following(store)
    ticket = await manager.claim(PROVIDER, "m", 4 * GIB, "call")
    view.note_claimed(PROVIDER, ticket)
    assert await _shown(view) == [ticket.ticket_id]
    await watch.received(1)  # the claim's write is on its way to the view, held
    await manager.release(PROVIDER, ticket.ticket_id)
    view.note_released(PROVIDER, ticket.ticket_id)
    assert await _shown(view) == []
    # the claim's own write reaches the view now, after the release was noted
    (claimed,) = await _passed(watch, 1)
    assert claimed.value is not None
    assert ticket.ticket_id in claimed.value.decode()
    assert await _shown(view) == []  # the finished call is not shown as running
    await _passed(watch, 2)  # the release's write: the view takes it as it is
    assert await _shown(view) == []
    await view.close()
    await manager.aclose()


async def test_an_older_delivery_does_not_hide_the_calls_own_new_ticket(
    store: StoreUnderTest,
) -> None:
    view, watch, manager, states, tickets = await _following(store)
    # another process's claim, written before this process's: its delivery comes late
    other = TicketManager(tickets, states, clock=store.clock)
    theirs = await other.claim(PROVIDER, "n", 2 * GIB, "theirs")
    await watch.received(1)  # their write is on its way to the view, held
    ours = await manager.claim(PROVIDER, "m", 4 * GIB, "ours")
    view.note_claimed(PROVIDER, ours)
    shown = await _shown(view)
    assert ours.ticket_id in shown  # the note, on the document the view held
    await _passed(watch, 1)  # the other process's revision, which predates ours
    assert ours.ticket_id in await _shown(view)
    await _passed(watch, 2)  # our own write: both, as the store holds them
    assert await _shown(view) == sorted([theirs.ticket_id, ours.ticket_id])
    await view.close()
    await manager.aclose()
    await other.aclose()


