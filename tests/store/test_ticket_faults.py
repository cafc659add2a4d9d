"""Tickets under faults: refusals decided on fresh state, and leases that outlive the TTL."""

from __future__ import annotations

import asyncio
import random

import pytest

from kubemoot import metrics
from kubemoot.clock import ManualClock
from kubemoot.runtime.tickets import ClaimRejected, TicketGone, TicketManager
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from tests.store.conftest import StoreUnderTest
from tests.store.test_tickets import GIB, PROVIDER, provider_state


async def _two_managers(
    store: StoreUnderTest, usable_mib: int
) -> tuple[TicketManager, TicketManager]:
    tickets = await store.bucket("tickets")
    states = await store.bucket("states")
    await states.put(encode_token(PROVIDER), provider_state(usable_mib).to_json())
    return tuple(  # type: ignore[return-value]
        TicketManager(tickets, states, clock=store.clock, rng=random.Random(seed))
        for seed in (1, 2)
    )


async def test_a_refusal_on_the_last_written_copy_is_decided_again_on_a_fresh_read(
    store: StoreUnderTest,
) -> None:
    # ``mine`` last wrote the document while ``theirs`` held 10 GiB; ``theirs`` has
    # released since. The copy ``mine`` wrote still shows the 10 GiB: a "no" decided on
    # it would refuse memory that is free.
    mine, theirs = await _two_managers(store, 15 * GIB)
    other = await theirs.claim(PROVIDER, "big", 10 * GIB, "other-process")
    small = await mine.claim(PROVIDER, "small", 1 * GIB, "this-process")
    await mine.release(PROVIDER, small.ticket_id)
    await theirs.release(PROVIDER, other.ticket_id)
    for attempt in range(4):
        ticket = await mine.claim(PROVIDER, "big", 10 * GIB, f"this-process-{attempt}")
        await mine.release(PROVIDER, ticket.ticket_id)


async def test_a_refusal_on_the_callers_state_and_the_cached_copy_is_decided_again(
    store: StoreUnderTest,
) -> None:
    mine, theirs = await _two_managers(store, 15 * GIB)
    known = provider_state(15 * GIB)
    other = await theirs.claim(PROVIDER, "big", 10 * GIB, "other-process")
    small = await mine.claim(PROVIDER, "small", 1 * GIB, "this-process", provider_state=known)
    await mine.release(PROVIDER, small.ticket_id)
    await theirs.release(PROVIDER, other.ticket_id)
    ticket = await mine.claim(PROVIDER, "big", 10 * GIB, "this-process", provider_state=known)
    assert ticket.model_footprint_mib == 10 * GIB


async def test_a_refusal_on_fresh_state_stays_a_refusal(store: StoreUnderTest) -> None:
    mine, theirs = await _two_managers(store, 15 * GIB)
    await theirs.claim(PROVIDER, "big", 10 * GIB, "other-process")
    small = await mine.claim(PROVIDER, "small", 1 * GIB, "this-process")
    await mine.release(PROVIDER, small.ticket_id)
    with pytest.raises(ClaimRejected):
        await mine.claim(PROVIDER, "big", 10 * GIB, "this-process")
