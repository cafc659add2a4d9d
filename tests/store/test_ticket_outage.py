"""Tickets while the store is unavailable: the lane waits longer, not shorter, each time.

A replicated JetStream bucket whose stream is electing a leader answers "temporarily
unavailable" at once. A backoff that shrank with every failure (as it does for lost
compare-and-set races, where the longest waiter should go next) turned that into a hot
loop: one claimer process sent over a thousand reads in two seconds at a cluster busy
electing (seen in tests/operator/test_nats_cluster.py after the kill).
"""

from __future__ import annotations

import random

from kubemoot.clock import ManualClock
from kubemoot.runtime.tickets import TicketManager
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryBucket, MemoryKV
from kubemoot.store.protocol import Entry, StoreUnavailable
from kubemoot.testing.state import GIB, provider_state

PROVIDER = "gpu-a"


class RecordingClock(ManualClock):
    """A manual clock that remembers every sleep asked of it."""

    def __init__(self) -> None:
        super().__init__(start=1_700_000_000.0)
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await super().sleep(seconds)


class Ceiling(random.Random):
    """Jitter pinned to its upper bound, so each wait shows the backoff's ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Unavailable:
    """A bucket whose reads fail ``failures`` times before the store answers again."""

    def __init__(self, inner: MemoryBucket, failures: int) -> None:
        self._inner = inner
        self.failures = failures
        self.name = inner.name

    async def get(self, key: str) -> Entry | None:
        if self.failures > 0:
            self.failures -= 1
            raise StoreUnavailable(f"get {self.name}/{key}: no stream leader")
        return await self._inner.get(key)

    async def put(self, key: str, value: bytes) -> int:
        return await self._inner.put(key, value)


async def _outage(failures: int) -> tuple[RecordingClock, Unavailable, TicketManager]:
    """A manager whose provider-state reads fail ``failures`` times before they answer."""
    clock = RecordingClock()
    kv = MemoryKV(clock)
    tickets = await kv.bucket("tickets")
    states = Unavailable(await kv.bucket("states"), failures=failures)
    await states.put(encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=8 * GIB).to_json())
    manager = TicketManager(
        tickets, states, clock=clock, rng=Ceiling(), max_attempts=20,  # type: ignore[arg-type]
        backoff_base_seconds=0.001, backoff_cap_seconds=0.05,
    )
    return clock, states, manager


async def test_consecutive_store_failures_back_off_longer_up_to_the_cap() -> None:
    clock, _, manager = await _outage(10)
    ticket = await manager.claim(PROVIDER, "m", 2 * GIB, "holder")
    assert ticket.model_footprint_mib == 2 * GIB  # served once the store answered
    assert len(clock.sleeps) == 10  # one wait per failure
    assert clock.sleeps == sorted(clock.sleeps), clock.sleeps  # never shorter
    assert clock.sleeps[0] < clock.sleeps[-1] == 0.05  # doubling up to the cap


async def test_a_success_starts_the_outage_backoff_over() -> None:
    clock, states, manager = await _outage(8)
    first = await manager.claim(PROVIDER, "m", 2 * GIB, "one")
    await manager.release(PROVIDER, first.ticket_id)
    before = list(clock.sleeps)
    states.failures = 1  # every claim reads the provider's state: this one fails once
    await manager.claim(PROVIDER, "m", 2 * GIB, "two")
    assert clock.sleeps[len(before):] == [before[0]]  # the first step again, not the cap
