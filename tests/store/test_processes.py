"""Separate processes with separate NATS connections: races and a SIGKILLed holder."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubemoot.clock import ManualClock
from kubemoot.runtime.tickets import ClaimRejected, TicketManager
from kubemoot.store.keys import encode_token
from kubemoot.testing.state import GIB, provider_state
from tests.store.conftest import make_store
from tests.store.test_tickets import PROVIDER

CLAIMER = str(Path(__file__).with_name("_claimer.py"))
ROOT = str(Path(__file__).resolve().parents[2])


async def spawn(*args: object) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, CLAIMER, *map(str, args),
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip


def overcommits(intervals: list[tuple[float, float, int]], usable: int) -> int:
    """Moments (each grant) when the memory held by all processes exceeded the budget."""
    count = 0
    for granted, _released, _ in intervals:
        held = sum(f for g, r, f in intervals if g <= granted < r)
        count += held > usable
    return count


@pytest.mark.slow
@settings(max_examples=2, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    usable_gib=st.integers(min_value=4, max_value=16),
    footprints=st.lists(st.integers(min_value=1, max_value=6), min_size=4, max_size=4),
)
async def test_claimers_in_separate_processes_never_overcommit(
    nats_url: str, usable_gib: int, footprints: list[int]
) -> None:
    store = await make_store("nats", nats_url)
    try:
        tickets = await store.bucket("tickets")
        states = await store.bucket("states")
        usable = usable_gib * GIB
        await states.put(
            encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=usable).to_json()
        )
        processes = [
            await spawn(nats_url, tickets.name, states.name, "race", seed, 8,
                        *(f * GIB for f in footprints))
            for seed in range(3)
        ]
        outputs = await asyncio.wait_for(
            asyncio.gather(*(p.communicate() for p in processes)), 60
        )
        assert all(p.returncode == 0 for p in processes)
        intervals = [tuple(i) for out, _ in outputs for i in json.loads(out)["intervals"]]
        assert intervals, "no claim succeeded at all"
        assert overcommits(intervals, usable) == 0  # type: ignore[arg-type]
        manager = TicketManager(tickets, states, clock=store.clock)
        assert await manager.active(PROVIDER) == []
    finally:
        await store.kv.close()


@pytest.mark.slow
async def test_a_sigkilled_holder_returns_memory_after_its_ttl_and_not_before(
    nats_url: str,
) -> None:
    store = await make_store("nats", nats_url)
    ttl = 60.0  # the holder's own clock is real; the survivor's is moved by the test
    try:
        tickets = await store.bucket("tickets")
        states = await store.bucket("states")
        await states.put(
            encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=8 * GIB).to_json()
        )
        holder = await spawn(nats_url, tickets.name, states.name, "hold", ttl, 8 * GIB)
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), 20)
        ticket_id = json.loads(line)["ticketId"]
        holder.kill()  # SIGKILL: no finally runs
        await holder.wait()
        clock = ManualClock(store.clock.now())
        manager = TicketManager(tickets, states, clock=clock, rng=random.Random(1))
        [held] = await manager.active(PROVIDER)
        assert held.ticket_id == ticket_id
        clock.set(held.expires_at - 0.05)
        with pytest.raises(ClaimRejected):  # not before: the dead holder's memory is still taken
            await manager.claim(PROVIDER, "next", 8 * GIB, "survivor")
        clock.set(held.expires_at + 0.05)
        ticket = await manager.claim(PROVIDER, "next", 8 * GIB, "survivor")
        assert [t.ticket_id for t in await manager.active(PROVIDER)] == [ticket.ticket_id]
    finally:
        await store.kv.close()
