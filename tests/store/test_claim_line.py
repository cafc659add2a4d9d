"""The claim line across processes: two ticket managers on one store, as two processes.

Each manager stands for a process of its own (one store connection each on NATS); the
first's writes all lose their races to a rival, as a slow process's would, and only the
line lets it be served before a later claimer whose write wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from kubemoot.clock import Clock, SystemClock
from kubemoot.runtime.ticket_requests import Announcements
from kubemoot.runtime.tickets import ClaimConflict, ClaimRejected, TicketManager
from kubemoot.store.bus import Bus, MemoryBus
from kubemoot.store.documents import (
    AnnouncedRequests,
    ProviderTickets,
    RequestKind,
    Ticket,
    TicketRequest,
    TicketState,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.nats import NatsKV
from kubemoot.store.natsbus import NatsBus
from kubemoot.store.protocol import KV, Bucket, RevisionMismatch
from kubemoot.testing.state import GIB, provider_state
from kubemoot.testing.waiting import until_stored, wait_until
from tests.store.conftest import StoreUnderTest
from tests.store.test_tickets import PROVIDER


class LosingBucket:
    """A real bucket where a rival writes the key just before each compare-and-set of
    this process, so every one it tries loses (whether it read the revision it writes
    on, kept it from its own last write, or had it delivered by a watch)."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.name = inner.name
        self.losing = True  # False: the rival has stopped

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        entry = await self.inner.get(key)
        if entry is not None and self.losing:
            # The rival's write; a compare-and-set itself, so that it never puts back a
            # stale copy over another process's write (then that write moved the key).
            with contextlib.suppress(RevisionMismatch):
                await self.inner.update(key, entry.value, expected_revision=entry.revision)
        return await self.inner.update(key, value, expected_revision=expected_revision)

    def __getattr__(self, attribute: str) -> object:
        return getattr(self.inner, attribute)


@dataclass
class Shared:
    """The buckets two processes share, and the clock their managers read."""

    tickets: Bucket
    states: Bucket
    requests: Bucket
    clock: Clock
    bus: Bus | None = None  # where contended operations go to a combiner

    def manager(self, seed: int, *, tickets: Bucket | None = None,
                line: bool = True, request_seconds: float = 60) -> TicketManager:
        # Announcements last long enough for a loaded machine to get the other
        # process's write in; without the line, 40 lost races end the claim.
        return TicketManager(tickets or self.tickets, self.states, clock=self.clock,
                             rng=random.Random(seed), max_attempts=40,
                             requests=self.requests if line else None,
                             request_seconds=request_seconds, bus=self.bus)


@pytest.fixture
async def shared(store: StoreUnderTest) -> AsyncIterator[Shared]:
    # A lost race backs off for a few milliseconds on the managers' clock; the embedded
    # store gets the wall clock here so those waits pass by themselves.
    kv: KV = store.kv if store.kind == "nats" else MemoryKV(SystemClock())
    clock = store.clock if store.kind == "nats" else SystemClock()
    states = await kv.bucket(store.name("states"), max_age=600)
    await states.put(encode_token(PROVIDER),
                     provider_state(PROVIDER, usable_mib=8 * GIB).to_json())
    tickets = await kv.bucket(store.name("tickets"), max_age=600)
    await tickets.put(encode_token(PROVIDER), ProviderTickets(provider=PROVIDER).to_json())
    yield Shared(tickets, states, await kv.bucket(store.name("requests"), max_age=600),
                 clock)
    if store.kind == "memory":
        await kv.close()


@pytest.fixture(params=["announced", "combined"])
async def lined(request: pytest.FixtureRequest, shared: Shared,
                store: StoreUnderTest) -> AsyncIterator[Shared]:
    """The shared buckets, with a bus for a combiner ("combined") or without one."""
    if request.param == "announced":
        yield shared
        return
    bus: Bus = NatsBus(store.kv) if isinstance(store.kv, NatsKV) else MemoryBus()  # type: ignore[assignment]
    yield Shared(shared.tickets, shared.states, shared.requests, shared.clock, bus)
    if isinstance(bus, MemoryBus):
        await bus.close()


async def test_the_earlier_waiter_in_another_process_is_served_first(
        lined: Shared) -> None:
    # With a bus the slow process finds nobody combining and combines itself: its own
    # claim comes back to it over the bus, loses, and is announced all the same.
    shared = lined
    slow = shared.manager(1, tickets=LosingBucket(shared.tickets))  # type: ignore[arg-type]
    fast = shared.manager(2)
    assert await slow.open() and await fast.open()
    waiting = asyncio.create_task(slow.claim(PROVIDER, "m", 6 * GIB, "slow"))
    # The slow process lost its races and announced its claim; the fast one sees it.
    await until_stored(shared.requests, lambda: fast.announced(PROVIDER), timeout=30,
                       what="the slow claim announced and seen by the other process")
    # The fast process's write wins, yet the 6 GiB go to the claim that came first.
    with pytest.raises(ClaimRejected, match="does not fit"):
        await fast.claim(PROVIDER, "m", 6 * GIB, "fast")
    ticket = await asyncio.wait_for(waiting, 30)
    assert [t.ticket_id for t in await fast.active(PROVIDER)] == [ticket.ticket_id]
    # The announcement is gone once served, and a second look grants nothing twice.
    await until_stored(shared.requests, lambda: not fast.announced(PROVIDER), timeout=30,
                       what="the served announcement removed")
    # The slow process's release loses its races too, and is announced like the claim:
    # the fast process's next write applies it before its own claim.
    # (With a bus the release may instead go to the fast process if it combines by now,
    # having lost a race to the slow one's rival: its write serves it, unannounced.)
    releasing = asyncio.create_task(slow.release(PROVIDER, ticket.ticket_id))
    if shared.bus is None:
        await until_stored(shared.requests, lambda: fast.announced(PROVIDER), timeout=30,
                           what="the slow release announced and seen by the other process")
    else:
        await until_stored(shared.requests,
                           lambda: fast.announced(PROVIDER) or releasing.done(), timeout=30,
                           what="the slow release announced, or done by the combiner")
    again = await fast.claim(PROVIDER, "m", 6 * GIB, "fast")
    await asyncio.wait_for(releasing, 30)
    assert [t.ticket_id for t in await fast.active(PROVIDER)] == [again.ticket_id]
    await slow.aclose()
    await fast.aclose()


class LosingOnce(LosingBucket):
    """A bucket whose first compare-and-set loses to a rival, and no later one."""

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        try:
            return await super().update(key, value, expected_revision=expected_revision)
        finally:
            self.losing = False


@pytest.mark.parametrize("combining", [True, False], ids=["combiner", "no-combiner"])
async def test_a_process_whose_writes_all_lose_is_served_by_the_combiner(
        shared: Shared, store: StoreUnderTest, combining: bool) -> None:
    # One process lost a race once and became the provider's combiner; another loses
    # every race it tries. Its claim goes to the combiner over the bus, whose write
    # grants it: nothing needs to be announced, nobody else needs to write. Without a
    # bus the claim waits in the line for a write by someone, and nobody writes.
    bus: Bus | None = None
    if combining:
        bus = NatsBus(store.kv) if isinstance(store.kv, NatsKV) else MemoryBus()  # type: ignore[assignment]
    lined = Shared(shared.tickets, shared.states, shared.requests, shared.clock, bus)
    combiner = lined.manager(1, tickets=LosingOnce(shared.tickets))  # type: ignore[arg-type]
    loser = lined.manager(2, tickets=LosingBucket(shared.tickets))  # type: ignore[arg-type]
    assert await combiner.open() and await loser.open()
    first = await combiner.claim(PROVIDER, "m", 1 * GIB, "combiner")
    claiming = asyncio.create_task(loser.claim(PROVIDER, "m", 2 * GIB, "loser"))
    if not combining:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(claiming), 2)
        claiming.cancel()
        await asyncio.gather(claiming, return_exceptions=True)
        assert not loser.combines and loser.combined == combiner.combined == 0
    else:
        granted = await asyncio.wait_for(claiming, 30)
        held = {t.ticket_id: t.holder_id for t in await combiner.active(PROVIDER)}
        assert held == {first.ticket_id: "combiner", granted.ticket_id: "loser"}
        # Its release goes the same way.
        await asyncio.wait_for(loser.release(PROVIDER, granted.ticket_id), 30)
        assert [t.ticket_id for t in await combiner.active(PROVIDER)] == [first.ticket_id]
        # Both operations went to the combiner, and it took both (its own claim took
        # the same way, found nobody combining and came back to be written here).
        assert loser.combines and loser.combined == 2
        assert combiner.combined >= 2
    await loser.aclose()
    await combiner.aclose()
    if isinstance(bus, MemoryBus):
        await bus.close()


async def test_without_the_line_the_later_write_wins(shared: Shared) -> None:
    # The same race with nothing announced: the slow claimer never gets in.
    slow = shared.manager(1, tickets=LosingBucket(shared.tickets), line=False)  # type: ignore[arg-type]
    fast = shared.manager(2, line=False)
    waiting = asyncio.create_task(slow.claim(PROVIDER, "m", 6 * GIB, "slow"))
    granted = await fast.claim(PROVIDER, "m", 6 * GIB, "fast")
    with pytest.raises(ClaimConflict):
        await asyncio.wait_for(waiting, 60)
    assert [t.ticket_id for t in await fast.active(PROVIDER)] == [granted.ticket_id]


async def test_a_waiter_that_died_leaves_the_line_when_its_place_lapses(
        store: StoreUnderTest) -> None:
    tickets = await store.bucket("tickets")
    states = await store.bucket("states")
    requests = await store.bucket("requests")
    await states.put(encode_token(PROVIDER),
                     provider_state(PROVIDER, usable_mib=8 * GIB).to_json())
    manager = TicketManager(tickets, states, clock=store.clock, rng=random.Random(3),
                            requests=requests, line_seconds=5.0)
    assert await manager.open()
    big = await manager.claim(PROVIDER, "m", 6 * GIB, "holder")
    # A process announced a 4 GiB claim and died; its announcement lapses in 2 s.
    now = store.clock.now()
    ticket = Ticket(ticket_id="dead-claim", model="m", model_footprint_mib=4 * GIB,
                    holder_id="dead", state=TicketState.RUNNING, started_at=now,
                    expires_at=now + 180)
    dead = AnnouncedRequests(provider=PROVIDER, requests=[TicketRequest(
        provider=PROVIDER, kind=RequestKind.CLAIM, ticket_id="dead-claim", ticket=ticket,
        expires_at=now + 2)])
    await requests.create(f"{encode_token(PROVIDER)}.dead-process", dead.to_json())
    await until_stored(requests, lambda: manager.announced(PROVIDER), timeout=30,
                       what="the dead process's announcement seen")
    # The next write applies it: 4 GiB do not fit beside 6, so it takes a place in line.
    await manager.renew(PROVIDER, big.ticket_id)
    document, _ = await manager.read(PROVIDER)
    assert [e.holder_id for e in document.line] == ["dead"]
    assert [t.ticket_id for t in document.tickets] == [big.ticket_id]
    await store.age(3.0)  # the announcement lapsed; the place in line has not
    await manager.release(PROVIDER, big.ticket_id)
    with pytest.raises(ClaimRejected, match="promised to claimers in line"):
        await manager.claim(PROVIDER, "m", 6 * GIB, "later")
    await store.age(3.0)  # five seconds after its last try the dead waiter's place lapses
    granted = await manager.claim(PROVIDER, "m", 6 * GIB, "later")
    document, _ = await manager.read(PROVIDER)
    assert document.line == [] and [t.ticket_id for t in document.tickets] == [
        granted.ticket_id]
    assert manager.announced(PROVIDER) == []  # lapsed: nobody applies it any more
    await manager.aclose()


async def test_a_claim_given_up_after_its_announcement_leaves_nothing_behind(
        shared: Shared) -> None:
    losing = LosingBucket(shared.tickets)
    slow = shared.manager(1, tickets=losing)  # type: ignore[arg-type]
    fast = shared.manager(2)
    assert await slow.open() and await fast.open()
    waiting = asyncio.create_task(slow.claim(PROVIDER, "m", 6 * GIB, "slow"))
    await until_stored(shared.requests, lambda: fast.announced(PROVIDER), timeout=30,
                       what="the slow claim announced and seen by the other process")
    waiting.cancel()  # its caller gives up while the announcement is still live
    with pytest.raises(asyncio.CancelledError):
        await waiting
    losing.losing = False  # the slow process's next write gets in: it withdraws the claim

    async def withdrawn() -> bool:
        document, _ = await fast.read(PROVIDER)
        return bool(document.served)

    # Marked served: the other process still holds the announcement (nobody deletes
    # its key), yet its next write grants it nothing and forgets it
    # (tests/runtime/test_ticket_decision.py shows that rule).
    await until_stored(shared.tickets, withdrawn, timeout=30, what="the claim withdrawn")
    mine = await fast.claim(PROVIDER, "m", 6 * GIB, "fast")
    assert [t.ticket_id for t in await fast.active(PROVIDER)] == [mine.ticket_id]
    assert fast.announced(PROVIDER) == []
    await slow.aclose()
    await fast.aclose()


class CountedReads:
    """A real bucket that counts this process's reads of it."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.name = inner.name
        self.reads = 0

    async def get(self, key: str) -> object:
        self.reads += 1
        return await self.inner.get(key)

    def __getattr__(self, attribute: str) -> object:
        return getattr(self.inner, attribute)


@pytest.mark.parametrize("line", [True, False], ids=["line", "no-line"])
async def test_after_a_lost_race_the_next_writes_need_no_read(shared: Shared,
                                                              line: bool) -> None:
    # Two processes write the same document in turns, so each of A's kept copies is
    # stale by its next claim. With the line, A follows the document's watch after its
    # first lost race and writes on the delivered revision; without, it reads each time.
    counted = CountedReads(shared.tickets)
    a = shared.manager(1, tickets=counted, line=line)  # type: ignore[arg-type]
    b = shared.manager(2)
    for turn in range(6):
        await b.claim(PROVIDER, "m", 0, f"b-{turn}")
        await a.claim(PROVIDER, "m", 0, f"a-{turn}")
    # The first claim reads (nothing kept yet), and so does the try after the first
    # lost race (the revision that beat it came before the watch began).
    assert counted.reads <= 2 if line else counted.reads == 6
    active = await b.active(PROVIDER)
    assert len(active) == 12
    await a.aclose()
    await b.aclose()


@pytest.mark.parametrize("line", [True, False], ids=["line", "no-line"])
async def test_after_a_lost_race_the_state_comes_from_its_watch(shared: Shared,
                                                                line: bool) -> None:
    # As above, but counting reads of the provider state: a claim that lost a race used
    # to read the state before each later try. With the line the lane follows the
    # state's watch from its first lost race on and decides on what it delivers.
    states = CountedReads(shared.states)
    a = TicketManager(shared.tickets, states, clock=shared.clock,  # type: ignore[arg-type]
                      rng=random.Random(1), max_attempts=40,
                      requests=shared.requests if line else None, request_seconds=60)
    b = shared.manager(2)
    for turn in range(6):
        await b.claim(PROVIDER, "m", 0, f"b-{turn}")
        await a.claim(PROVIDER, "m", 0, f"a-{turn}")
    # Reads until the watch is set up (the first claims', 3 here), none after: the
    # read made with the watch ready stands until the watch delivers a change.
    assert states.reads <= 4 if line else states.reads >= 6
    assert len(await b.active(PROVIDER)) == 12
    # A "no" on the delivered state is confirmed on a read one before it is answered.
    before = states.reads
    with pytest.raises(ClaimRejected):
        await a.claim(PROVIDER, "m", 9 * GIB, "too-big")
    assert states.reads == before + 1
    await a.aclose()
    await b.aclose()


async def test_an_announcer_knows_when_an_older_one_waits_ahead_of_it(
    shared: Shared,
) -> None:
    # Two processes' announcements on one provider: the later one is behind the
    # earlier while the newest ticket document leaves the earlier unsettled, and its
    # process lets the earlier one's write go first (tickets._wait_behind).
    first, second = (
        Announcements(shared.requests, clock=shared.clock, seconds=60,
                      rng=random.Random(seed)) for seed in (1, 2)
    )
    assert await first.following() and await second.following()
    ticket = Ticket(ticket_id="t-first", model="m", model_footprint_mib=GIB,
                    holder_id="first", started_at=shared.clock.now(),
                    expires_at=shared.clock.now() + 60, state=TicketState.RUNNING)
    older = await first.announce(PROVIDER, [first.request(
        PROVIDER, "t-first", ticket=ticket, kind=RequestKind.CLAIM)], asyncio.Event())
    assert older is not None
    for _ in range(500):  # its watch delivers the first announcement
        if second.pending(PROVIDER):
            break
        await asyncio.sleep(0.01)
    newer = await second.announce(PROVIDER, [second.request(
        PROVIDER, "t-second", kind=RequestKind.RELEASE)], asyncio.Event())
    assert newer is not None
    unsettled = ProviderTickets(provider=PROVIDER).to_json()
    assert second.behind(PROVIDER, newer, unsettled)
    # Once a delivered document carries the earlier claim, nothing is ahead any more.
    settled = ProviderTickets(provider=PROVIDER, tickets=[ticket]).to_json()
    assert not second.behind(PROVIDER, newer, settled)
    assert not first.behind(PROVIDER, older, unsettled)  # the oldest races
    await first.aclose()
    await second.aclose()


async def test_a_second_announcement_of_a_request_already_served_is_not_pending(
    shared: Shared,
) -> None:
    # One operation can be announced twice: a combiner announces the claim it took from
    # a process and could not write, and the process, handed the claim back, announces
    # it again. A writer that served the first copy must not hold the second pending
    # (it was listed until it lapsed, a minute: test_the_earlier_waiter's flake).
    writer, announcer = (
        Announcements(shared.requests, clock=shared.clock, seconds=60,
                      rng=random.Random(seed)) for seed in (1, 2)
    )
    assert await writer.following()
    ticket = Ticket(ticket_id="t-once", model="m", model_footprint_mib=GIB,
                    holder_id="slow", started_at=shared.clock.now(),
                    expires_at=shared.clock.now() + 60, state=TicketState.RUNNING)

    async def announce(ticket_id: str) -> TicketRequest:
        claim = announcer.request(PROVIDER, ticket_id, ticket=ticket.model_copy(
            update={"ticket_id": ticket_id}), kind=RequestKind.CLAIM)
        assert await announcer.announce(PROVIDER, [claim], asyncio.Event()) is not None
        return claim

    def pending() -> list[str]:
        return [r.ticket_id for r in writer.pending(PROVIDER)]

    first = await announce("t-once")
    await until_stored(shared.requests, lambda: pending() == ["t-once"], timeout=30,
                       what="the claim delivered")
    writer.settle([first], [])  # its write granted the claim
    await announce("t-once")  # the copy, announced again
    await announce("t-after")  # delivered after the copy
    await until_stored(shared.requests, lambda: "t-after" in pending(), timeout=30,
                       what="the later claim delivered")
    assert pending() == ["t-after"]
    await writer.aclose()


async def test_an_idle_combiner_stops_and_the_next_contended_claim_is_still_served(
        shared: Shared, store: StoreUnderTest) -> None:
    # A combiner listens only while its provider is contended: once its lane has been
    # idle for combine_idle_seconds it leaves the subject, and a claim that loses its
    # races afterwards finds its way again (a combiner anew, or the line).
    bus: Bus = NatsBus(store.kv) if isinstance(store.kv, NatsKV) else MemoryBus()  # type: ignore[assignment]
    lined = Shared(shared.tickets, shared.states, shared.requests, shared.clock, bus)
    combiner = lined.manager(1, tickets=LosingOnce(shared.tickets))  # type: ignore[arg-type]
    combiner.combine_idle_seconds = 0.2
    loser = lined.manager(2, tickets=LosingBucket(shared.tickets))  # type: ignore[arg-type]
    assert await combiner.open() and await loser.open()
    first = await combiner.claim(PROVIDER, "m", 1 * GIB, "combiner")
    granted = await asyncio.wait_for(loser.claim(PROVIDER, "m", 2 * GIB, "loser"), 30)
    lane = combiner._lanes[PROVIDER]
    assert lane.combining is not None  # it combined for the loser
    await wait_until(lambda: lane.combining is None, timeout=30,
                     what="the idle combiner leaving the subject")
    # contended again: the loser's release loses every race; it is done by the other
    # process's next write (a combiner anew, or the line), never lost
    releasing = asyncio.create_task(loser.release(PROVIDER, granted.ticket_id))
    await asyncio.sleep(0.5)
    await asyncio.wait_for(combiner.release(PROVIDER, first.ticket_id), 30)
    await asyncio.wait_for(releasing, 30)
    assert await combiner.active(PROVIDER) == []
    await loser.aclose()
    await combiner.aclose()
    if isinstance(bus, MemoryBus):
        await bus.close()


async def test_combiners_that_start_together_keep_the_lowest_rank_after_the_roll_call(
        shared: Shared, store: StoreUnderTest) -> None:
    # Every process that lost the same race can find nobody listening at the same moment
    # and start combining together; their roll call leaves one, the lowest rank, and a
    # process whose writes all lose is then served through that one.
    bus: Bus = NatsBus(store.kv) if isinstance(store.kv, NatsKV) else MemoryBus()  # type: ignore[assignment]
    lined = Shared(shared.tickets, shared.states, shared.requests, shared.clock, bus)
    managers = [lined.manager(seed) for seed in (1, 2, 3)]
    for manager in managers:
        manager.combine_idle_seconds = 600  # only the roll call may stop them here
        assert await manager.open()
    lanes = [manager._lane(PROVIDER) for manager in managers]
    await asyncio.gather(*(manager._combine(lane)
                           for manager, lane in zip(managers, lanes, strict=True)))
    ranks = [lane.rank for lane in lanes]  # kept by a combiner that stopped
    assert len(set(ranks)) == 3
    await wait_until(lambda: sum(lane.combining is not None for lane in lanes) == 1,
                     timeout=30, what="all combiners but one stopping")
    await asyncio.sleep(0.2)  # late answers of the roll call stop nobody else
    staying = [lane for lane in lanes if lane.combining is not None]
    assert [lane.rank for lane in staying] == [min(ranks)]
    loser = lined.manager(4, tickets=LosingBucket(shared.tickets))  # type: ignore[arg-type]
    assert await loser.open()
    granted = await asyncio.wait_for(loser.claim(PROVIDER, "m", 2 * GIB, "loser"), 30)
    held = {t.ticket_id: t.holder_id for t in await managers[0].active(PROVIDER)}
    assert held == {granted.ticket_id: "loser"}
    await loser.aclose()
    for manager in managers:
        await manager.aclose()
    if isinstance(bus, MemoryBus):
        await bus.close()
