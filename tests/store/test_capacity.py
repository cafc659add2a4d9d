"""Waiting for capacity: the change counter over state and ticket buckets."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from kubemoot.clock import Clock, ManualClock
from kubemoot.runtime.capacity import CapacityWatch, WatchUnavailable
from kubemoot.runtime.tickets import TicketManager
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, provider_state
from tests.store.conftest import StoreUnderTest
from tests.store.test_tickets import PROVIDER


async def _past_timeout(clock: Clock, wait: Coroutine[Any, Any, int], seconds: float) -> int:
    """Await ``wait``; on a manual clock, move time past its timeout once it waits."""
    task = asyncio.create_task(wait)
    if isinstance(clock, ManualClock):
        await clock.until_waiting()
        clock.advance(seconds)
    return await task


async def _waiting(clock: Clock) -> None:
    """Let a waiter task reach its wait (observed on a manual clock, else one loop turn)."""
    if isinstance(clock, ManualClock):
        await clock.until_waiting()
    else:
        await asyncio.sleep(0)


async def started(store: StoreUnderTest) -> tuple[CapacityWatch, TicketManager]:
    states = await store.bucket("states")
    tickets = await store.bucket("tickets")
    await states.put(encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=8 * GIB).to_json())
    watch = CapacityWatch(states, tickets, clock=store.clock)
    await watch.start()
    return watch, TicketManager(tickets, states, clock=store.clock)


async def test_claims_releases_and_probes_advance_the_counter(store: StoreUnderTest) -> None:
    watch, manager = await started(store)
    seen = watch.counter
    ticket = await manager.claim(PROVIDER, "m", GIB, "h")
    seen = await watch.changed_since(seen, 5.0)
    await manager.release(PROVIDER, ticket.ticket_id)
    seen = await watch.changed_since(seen, 5.0)
    states = await store.bucket("states")  # another bucket: a probe elsewhere is no change
    await states.put(encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=8 * GIB).to_json())
    with pytest.raises(TimeoutError):
        await _past_timeout(store.clock, watch.changed_since(seen, 0.2), 0.2)
    await watch.close()


async def test_returns_at_once_when_the_counter_already_moved(store: StoreUnderTest) -> None:
    watch, manager = await started(store)
    before = watch.counter
    await manager.claim(PROVIDER, "m", GIB, "h")
    await watch.changed_since(before, 5.0)  # the claim's change has arrived
    assert await watch.changed_since(before, 0.0) == watch.counter
    await watch.close()


async def test_a_waiter_wakes_on_a_change(store: StoreUnderTest) -> None:
    watch, manager = await started(store)
    waiter = asyncio.create_task(watch.changed_since(watch.counter, 10.0))
    await _waiting(store.clock)
    assert not waiter.done()
    await manager.claim(PROVIDER, "m", GIB, "h")
    assert await asyncio.wait_for(waiter, 5.0) >= 1
    await watch.close()


async def test_notify_wakes_waiters_locally(store: StoreUnderTest) -> None:
    watch, _ = await started(store)
    waiter = asyncio.create_task(watch.changed_since(watch.counter, 10.0))
    await asyncio.sleep(0)
    watch.notify()  # e.g. the discussion ended
    assert await asyncio.wait_for(waiter, 1.0) == 1
    await watch.close()


async def test_closing_tells_waiters_there_is_no_wake_source(store: StoreUnderTest) -> None:
    watch, _ = await started(store)
    waiter = asyncio.create_task(watch.changed_since(watch.counter, 10.0))
    await _waiting(store.clock)
    await store.kv.close()
    with pytest.raises(WatchUnavailable):
        await asyncio.wait_for(waiter, 5.0)


async def test_start_fails_at_once_without_a_store() -> None:
    kv = MemoryKV()
    states, tickets = await kv.bucket("s"), await kv.bucket("t")
    await kv.close()
    watch = CapacityWatch(states, tickets, clock=ManualClock())
    with pytest.raises(WatchUnavailable):
        await watch.start()


async def test_a_lapsed_ticket_wakes_waiters() -> None:
    clock = ManualClock(1000.0)
    kv = MemoryKV(clock)
    states, tickets = await kv.bucket("s"), await kv.bucket("t")
    await states.put(encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=8 * GIB).to_json())
    manager = TicketManager(tickets, states, clock=clock, ttl_seconds=30.0)
    await manager.claim(PROVIDER, "m", 8 * GIB, "dies")  # never released
    watch = CapacityWatch(states, tickets, clock=clock)
    await watch.start()  # learns the ticket's expiry from the current document
    seen = watch.counter
    with pytest.raises(TimeoutError):
        await _past_timeout(clock, watch.changed_since(seen, 0.05), 0.05)
    clock.advance(30.0)
    assert await watch.changed_since(seen, 0.05) > seen
    await watch.close()
