"""A claimer in a process of its own, with its own NATS connection (for the tests).

``python _claimer.py URL TICKETS STATES race SEED ROUNDS FOOTPRINT…`` claims and
releases in a loop and prints one JSON line: the intervals it held memory for.
``python _claimer.py URL TICKETS STATES hold TTL FOOTPRINT`` claims once, prints the
ticket id and then holds it for ever (the test kills it with SIGKILL).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from kubemoot.clock import SystemClock
from kubemoot.runtime.tickets import ClaimRejected, TicketManager
from kubemoot.settings import NatsSettings
from kubemoot.store.nats import NatsKV

PROVIDER = "gpu-a"


async def main(argv: list[str]) -> None:
    url, tickets_name, states_name, mode, *rest = argv
    kv = await NatsKV.connect(NatsSettings(servers=[url]))
    tickets = await kv.bucket(tickets_name, max_age=600)
    states = await kv.bucket(states_name, max_age=600)
    if mode == "hold":
        manager = TicketManager(tickets, states, clock=SystemClock(), ttl_seconds=float(rest[0]))
        ticket = await manager.claim(PROVIDER, "m", int(rest[1]), "doomed")
        print(json.dumps({"ticketId": ticket.ticket_id}), flush=True)
        await asyncio.Event().wait()
    seed, rounds, *footprints = (int(x) for x in rest)
    manager = TicketManager(tickets, states, clock=SystemClock(), rng=random.Random(seed),
                            max_attempts=100)
    intervals: list[tuple[float, float, int]] = []

    async def claimer(footprint: int) -> None:
        for _ in range(rounds):
            try:
                ticket = await manager.claim(PROVIDER, "m", footprint, f"p{seed}")
            except ClaimRejected:
                await asyncio.sleep(0.001)  # the workload: look again shortly
                continue
            granted = time.time()
            await asyncio.sleep(0.002)  # the workload: hold the memory a moment
            intervals.append((granted, time.time(), footprint))
            await manager.release(PROVIDER, ticket.ticket_id)

    await asyncio.gather(*(claimer(f) for f in footprints))
    print(json.dumps({"intervals": intervals}), flush=True)
    await kv.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
