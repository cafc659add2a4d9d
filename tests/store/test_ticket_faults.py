"""Tickets under faults: refusals decided on fresh state, and leases that outlive the TTL."""

from __future__ import annotations

import asyncio
import random

import pytest

from kubemoot import metrics
from kubemoot.clock import LoopClock
from kubemoot.runtime.tickets import ClaimRejected, TicketManager
from kubemoot.settings import DEFAULTS
from kubemoot.sim.vloop import run_virtual
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, provider_state
from tests.store.conftest import StoreUnderTest
from tests.store.test_tickets import PROVIDER


async def _two_managers(
    store: StoreUnderTest, usable_mib: int, *, line_seconds: float = DEFAULTS.claim_line_seconds
) -> tuple[TicketManager, TicketManager]:
    tickets = await store.bucket("tickets")
    states = await store.bucket("states")
    await states.put(
        encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=usable_mib).to_json()
    )
    return tuple(  # type: ignore[return-value]
        TicketManager(tickets, states, clock=store.clock, rng=random.Random(seed),
                      line_seconds=line_seconds)
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
    known = provider_state(PROVIDER, usable_mib=15 * GIB)
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


# -- leases: on a virtual-time loop, so a TTL of minutes costs nothing real -------------


async def _manager_on_virtual_time(ttl: float) -> tuple[LoopClock, TicketManager]:
    clock = LoopClock(epoch=1_700_000_000.0)
    kv = MemoryKV(clock)
    tickets = await kv.bucket("tickets")
    states = await kv.bucket("states")
    await states.put(
        encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=16 * GIB).to_json()
    )
    return clock, TicketManager(tickets, states, clock=clock, ttl_seconds=ttl,
                                rng=random.Random(3))


def test_a_lease_keeps_a_ticket_alive_past_its_ttl_and_stops_on_exit() -> None:
    async def main() -> tuple[bool, bool, int]:
        _clock, manager = await _manager_on_virtual_time(30.0)
        ticket = await manager.claim(PROVIDER, "m", 4 * GIB, "long-call")
        renewed_before = metrics.LEASE_RENEWALS.labels(result="renewed")._value.get()
        async with manager.lease(PROVIDER, ticket.ticket_id) as lease:
            await asyncio.sleep(100.0)  # a call three times longer than the TTL
            alive_during = [t.ticket_id for t in await manager.active(PROVIDER)] == [
                ticket.ticket_id
            ]
        renewals = lease.renewals
        assert metrics.LEASE_RENEWALS.labels(result="renewed")._value.get() > renewed_before
        await asyncio.sleep(31.0)  # no renewal after the block: the TTL reclaims it
        lapsed_after = await manager.active(PROVIDER) == []
        return alive_during, lapsed_after, renewals

    alive_during, lapsed_after, renewals = run_virtual(main())
    assert alive_during
    assert lapsed_after
    assert renewals == 10  # every TTL/3 = 10 s for 100 s


def test_a_lease_whose_ticket_is_gone_stops_and_says_so() -> None:
    async def main() -> tuple[bool, int]:
        _clock, manager = await _manager_on_virtual_time(30.0)
        ticket = await manager.claim(PROVIDER, "m", 4 * GIB, "long-call")
        async with manager.lease(PROVIDER, ticket.ticket_id) as lease:
            await manager.release(PROVIDER, ticket.ticket_id)  # e.g. pruned elsewhere
            await asyncio.sleep(60.0)
        return lease.lost, lease.renewals

    assert run_virtual(main()) == (True, 0)


def test_a_state_change_gives_the_ticket_a_fresh_expiry() -> None:
    async def main() -> tuple[float, float]:
        clock, manager = await _manager_on_virtual_time(30.0)
        held = await manager.claim(PROVIDER, "m", 4 * GIB, "plan")
        await asyncio.sleep(20.0)
        taken = await manager.mark_running(PROVIDER, held.ticket_id)
        return taken.expires_at - held.expires_at, taken.expires_at - clock.now()

    moved, left = run_virtual(main())
    assert moved == pytest.approx(20.0)
    assert left == pytest.approx(30.0)



# -- the line: memory freed goes to the claimers refused first --------------------------


async def test_memory_freed_goes_to_the_claimer_in_line_before_a_newcomer(
    store: StoreUnderTest,
) -> None:
    first, second = await _two_managers(store, 15 * GIB)
    held = await first.claim(PROVIDER, "big", 10 * GIB, "holder")
    with pytest.raises(ClaimRejected):
        await second.claim(PROVIDER, "big", 10 * GIB, "waiting-one")  # joins the line
    document, _ = await first.read(PROVIDER)
    assert [e.holder_id for e in document.line] == ["waiting-one"]
    await first.release(PROVIDER, held.ticket_id)
    with pytest.raises(ClaimRejected, match="promised to claimers in line"):
        await first.claim(PROVIDER, "big", 10 * GIB, "newcomer")
    served = await second.claim(PROVIDER, "big", 10 * GIB, "waiting-one")
    document, _ = await second.read(PROVIDER)
    assert [t.ticket_id for t in document.tickets] == [served.ticket_id]
    assert [e.holder_id for e in document.line] == ["newcomer"]  # served: out of line


async def test_a_place_in_line_lapses_and_small_claims_fit_beside_it(
    store: StoreUnderTest,
) -> None:
    first, second = await _two_managers(store, 15 * GIB, line_seconds=2.0)
    held = await first.claim(PROVIDER, "big", 10 * GIB, "holder")
    with pytest.raises(ClaimRejected):
        await second.claim(PROVIDER, "big", 10 * GIB, "gone-away")
    with pytest.raises(ClaimRejected):
        await second.claim(PROVIDER, "huge", 40 * GIB, "never-fits")  # holds nobody up
    await first.release(PROVIDER, held.ticket_id)
    # 5 GiB stay beside the 10 GiB promised to the claimer in line.
    await first.claim(PROVIDER, "small", 5 * GIB, "beside")
    await store.age(first.line_seconds + 0.5)  # the claimer in line never came back
    late = await first.claim(PROVIDER, "big", 10 * GIB, "late")
    assert late.model_footprint_mib == 10 * GIB
