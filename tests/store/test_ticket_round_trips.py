"""Round trips of a claim: the caller's state and the manager's own copy of the tickets.

A claim may be decided on the provider state its caller already holds and on the
ticket document this manager last wrote; the compare-and-set keeps that safe, and a
refusal or a lost race sends the claim back to read both. These tests count the
store operations and check that the answers rest on what the store holds.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kubemoot.clock import Clock
from kubemoot.runtime.tickets import ClaimRejected, TicketManager
from kubemoot.store.documents import ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, Entry, HandingBucket, Watch
from kubemoot.testing.state import GIB, provider_state
from tests.store.conftest import StoreUnderTest

PROVIDER = "gpu-a"
KEY = encode_token(PROVIDER)


class CountingBucket:
    """A real bucket that counts the operations sent to it."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: Counter[str] = Counter()

    async def get(self, key: str) -> Entry | None:
        self.calls["get"] += 1
        return await self.inner.get(key)

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        self.calls["create"] += 1
        return await self.inner.create(key, value, ttl=ttl)

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        self.calls["update"] += 1
        return await self.inner.update(key, value, expected_revision=expected_revision)

    def update_then(self, key: str, value: bytes, expected_revision: int,
                    then: Callable[[int | Exception], None]) -> bool:
        # Passed on where the store offers it (NATS): the same compare-and-set, counted
        # as an update when it was sent.
        inner = self.inner
        if not (isinstance(inner, HandingBucket)
                and inner.update_then(key, value, expected_revision, then)):
            return False
        self.calls["update"] += 1
        return True

    async def put(self, key: str, value: bytes) -> int:
        self.calls["put"] += 1
        return await self.inner.put(key, value)

    async def delete(self, key: str, *, expected_revision: int | None = None) -> None:
        self.calls["delete"] += 1
        await self.inner.delete(key, expected_revision=expected_revision)

    async def keys(self) -> list[str]:
        return await self.inner.keys()

    def watch(self) -> Watch:
        return self.inner.watch()


class Setup:
    def __init__(
        self, tickets: CountingBucket, states: CountingBucket, manager: TicketManager,
        clock: Clock, age: Callable[[float], Awaitable[None]],
    ) -> None:
        self.age = age  # let seconds pass on the manager's clock
        self.tickets = tickets
        self.states = states
        self.manager = manager
        self.clock = clock

    def reset(self) -> None:
        self.tickets.calls.clear()
        self.states.calls.clear()

    async def publish(self, published: ProviderState) -> None:
        await self.states.inner.put(KEY, published.to_json())


@pytest.fixture
async def counted(store: StoreUnderTest) -> AsyncIterator[Setup]:
    tickets = CountingBucket(await store.bucket("tickets"))
    states = CountingBucket(await store.bucket("states"))
    manager = TicketManager(tickets, states, clock=store.clock, rng=random.Random(3))
    setup = Setup(tickets, states, manager, store.clock, store.age)
    await setup.publish(provider_state(PROVIDER, usable_mib=16 * GIB))
    # One claim and release first: from then on the manager holds the document it wrote.
    ticket = await manager.claim(PROVIDER, "warm-up", GIB, "h")
    await manager.release(PROVIDER, ticket.ticket_id)
    setup.reset()
    yield setup


async def test_with_the_callers_state_claim_and_release_are_one_write_each(
    counted: Setup,
) -> None:
    known = provider_state(PROVIDER, usable_mib=16 * GIB)
    ticket = await counted.manager.claim(PROVIDER, "a", 4 * GIB, "h", provider_state=known)
    assert [t.ticket_id for t in await counted.manager.active(PROVIDER)] == [ticket.ticket_id]
    counted.reset()
    await counted.manager.release(PROVIDER, ticket.ticket_id)
    assert await counted.manager.active(PROVIDER) == []
    # the same again, counted: no reads at all, one compare-and-set per operation
    counted.reset()
    ticket = await counted.manager.claim(PROVIDER, "a", 4 * GIB, "h", provider_state=known)
    await counted.manager.release(PROVIDER, ticket.ticket_id)
    assert counted.states.calls == Counter()
    assert counted.tickets.calls == Counter(update=2)


async def test_without_the_callers_state_the_claim_reads_it(counted: Setup) -> None:
    ticket = await counted.manager.claim(PROVIDER, "a", 4 * GIB, "h")
    await counted.manager.release(PROVIDER, ticket.ticket_id)
    assert counted.states.calls == Counter(get=1)
    assert counted.tickets.calls == Counter(update=2)


@pytest.mark.parametrize(
    ("known_resident", "published_resident", "granted", "state_reads"),
    [
        # the caller's copy is out of date and says "full"; the store says there is room
        ({"big": 14 * GIB}, {}, True, 1),
        # both say "full": refused, after one fresh read
        ({"big": 14 * GIB}, {"big": 14 * GIB}, False, 1),
        # the caller's copy says there is room and nobody raced: granted on it, no read
        ({}, {}, True, 0),
    ],
)
async def test_a_refusal_on_the_callers_state_is_decided_again_on_a_fresh_read(
    counted: Setup,
    known_resident: dict[str, int],
    published_resident: dict[str, int],
    granted: bool,
    state_reads: int,
) -> None:
    await counted.publish(provider_state(PROVIDER, usable_mib=16 * GIB, loaded=published_resident))
    known = provider_state(PROVIDER, usable_mib=16 * GIB, loaded=known_resident)
    if granted:
        await counted.manager.claim(PROVIDER, "a", 4 * GIB, "h", provider_state=known)
        assert len(await counted.manager.active(PROVIDER)) == 1
    else:
        with pytest.raises(ClaimRejected, match="does not fit"):
            await counted.manager.claim(PROVIDER, "a", 4 * GIB, "h", provider_state=known)
        assert await counted.manager.active(PROVIDER) == []
    assert counted.states.calls["get"] == state_reads


async def test_a_lost_race_decides_again_on_the_stored_state(counted: Setup) -> None:
    # Another process writes the ticket document, so this manager's copy is stale,
    # and meanwhile a probe published that the card filled up.
    other = TicketManager(counted.tickets.inner, counted.states.inner, clock=counted.clock)
    await other.claim(PROVIDER, "small", 0, "other")
    await counted.publish(provider_state(PROVIDER, usable_mib=16 * GIB, loaded={"big": 14 * GIB}))
    outdated = provider_state(PROVIDER, usable_mib=16 * GIB)  # the caller saw an empty card
    with pytest.raises(ClaimRejected, match="does not fit"):
        await counted.manager.claim(PROVIDER, "a", 4 * GIB, "h", provider_state=outdated)
    assert counted.states.calls["get"] >= 1
    assert [t.model for t in await counted.manager.active(PROVIDER)] == ["small"]


async def test_after_a_lost_race_the_kept_copy_waits_its_turn_in_the_next_operation(
    counted: Setup,
) -> None:
    # Another process writes, so this manager's kept copy is stale: its claim loses the
    # race on it, then reads and wins.
    other = TicketManager(counted.tickets.inner, counted.states.inner, clock=counted.clock)
    await other.claim(PROVIDER, "small", 0, "other")
    known = provider_state(PROVIDER, usable_mib=16 * GIB)
    ticket = await counted.manager.claim(PROVIDER, "a", GIB, "h", provider_state=known)
    assert counted.tickets.calls == Counter(get=1, update=2)
    # Its release is an operation of its own; having lost lately, the manager does not
    # write on the copy it kept (that would beat every process that must read first):
    # it steps aside and reads.
    counted.reset()
    await counted.manager.release(PROVIDER, ticket.ticket_id)
    assert counted.tickets.calls == Counter(get=1, update=1)
    assert [t.model for t in await counted.manager.active(PROVIDER)] == ["small"]
    # The second time, the race long past: one write on the kept copy, no read.
    await counted.age(1.0)
    counted.reset()
    ticket = await counted.manager.claim(PROVIDER, "a", GIB, "h", provider_state=known)
    await counted.manager.release(PROVIDER, ticket.ticket_id)
    assert counted.tickets.calls == Counter(update=2)
