"""A "no" decided on a stale copy: two processes, one store (DESIGN §6, issue #12).

Each harness is one process's runtime; they share one embedded store. A ticket manager
that last wrote the ticket document while the other process held memory keeps that
copy; a refusal decided on it would turn a free card into a gpu-busy wait.
"""

from __future__ import annotations

import asyncio
import random

from kubemoot.clock import LoopClock
from kubemoot.runtime.placement import Action
from kubemoot.runtime.tickets import ClaimRejected, TicketManager
from kubemoot.sim.vloop import run_virtual
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, NOW, gpu


async def test_a_free_card_is_not_refused_on_the_copy_this_process_last_wrote(make) -> None:
    mine = await make([gpu("a", 16)], declared={"big": 10, "small": 1})
    theirs = await make([gpu("a", 16)], declared={"big": 10, "small": 1},
                        kv=mine.kv, clock=mine.clock)
    other = await theirs.place("big", holder="other-process")
    assert other.action is Action.COLD_LOAD
    small = await mine.place("small", holder="this-process")
    assert small.action is Action.COLD_LOAD
    await mine.planner.release(small)
    await theirs.planner.release(other)
    mine.clock.advance(1.0)  # past the state cache: the view reads the card as free
    for attempt in range(4):
        placed = await mine.place("big", holder=f"this-process-{attempt}")
        assert (placed.action, placed.provider) == (Action.COLD_LOAD, "a"), placed.reason
        await mine.planner.release(placed)


def test_racing_processes_get_fair_shares_of_a_card_that_fits_one_at_a_time() -> None:
    # Two processes, five claimers each, all wanting the whole card for a second at a
    # time; a refused claimer looks again a second later. Both processes must be served.
    # The seconds are virtual (run_virtual): asyncio's sleeps cost nothing real here.
    async def main() -> list[int]:
        clock = LoopClock(epoch=NOW)
        kv = MemoryKV(clock=clock)
        tickets = await kv.bucket("tickets")
        states = await kv.bucket("states")
        await states.put(encode_token("a"), gpu("a", 11).to_json())
        managers = [TicketManager(tickets, states, clock=clock, rng=random.Random(seed))
                    for seed in (1, 2)]
        granted = [0, 0]

        async def claimer(process: int, index: int) -> None:
            manager = managers[process]
            for _ in range(20):
                try:
                    ticket = await manager.claim("a", "m", 10 * GIB, f"p{process}-{index}")
                except ClaimRejected:
                    await asyncio.sleep(1.0)
                    continue
                granted[process] += 1
                await asyncio.sleep(1.0)
                await manager.release("a", ticket.ticket_id)

        await asyncio.gather(*(claimer(p, i) for p in (0, 1) for i in range(5)))
        return granted

    granted = run_virtual(main())
    assert min(granted) > 0
    assert min(granted) / max(granted) >= 0.5, granted
