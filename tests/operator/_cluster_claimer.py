"""A claimer process for the NATS cluster test: claims and releases through any server.

``python _cluster_claimer.py URLS TICKETS STATES SEED ROUNDS FOOTPRINT…`` runs one task
per footprint; each claims ``ROUNDS`` tickets one after another, holds each briefly and
releases it. A claim or release the store could not confirm (a server died under it) is
retried; a claim whose answer was lost is reconciled by releasing any ticket of its own
holder id it does not know it holds, so nothing leaks. It prints ``running`` after its
first grant, then one JSON line: the (granted, released, footprint) intervals. Until its
first grant it tells on stderr which server it talks to and every new reason it was
not granted, so a stalled claimer explains itself in the test's failure message.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from kubemoot.clock import SystemClock
from kubemoot.runtime.tickets import ClaimConflict, ClaimRejected, TicketManager
from kubemoot.store.nats import NatsKV, NatsSettings
from kubemoot.store.protocol import StoreError

PROVIDER = "gpu-a"
PAUSE = 0.002  # seconds between two tries, so a retry loop does not spin


async def main(argv: list[str]) -> None:
    urls, tickets_name, states_name, *rest = argv
    seed, rounds, *footprints = (int(x) for x in rest)
    kv = await NatsKV.connect(NatsSettings(servers=urls.split(","), request_timeout=2.0,
                                           reconnect_wait=0.1, replicas=3))
    while True:  # a cluster still electing leaders answers slowly at first
        try:
            tickets = await kv.bucket(tickets_name)
            states = await kv.bucket(states_name)
            break
        except StoreError:
            await asyncio.sleep(PAUSE)
    url = kv.connection.connected_url
    print(f"connected to {url.geturl() if url else None}", file=sys.stderr, flush=True)
    manager = TicketManager(tickets, states, clock=SystemClock(), rng=random.Random(seed),
                            max_attempts=100, ttl_seconds=600)
    intervals: list[tuple[float, float, int]] = []
    announced = False
    told: set[str] = set()

    def not_granted(error: Exception) -> None:
        # Before the first grant only, and each distinct reason once: bounded output.
        reason = error.reason if isinstance(error, ClaimRejected) else str(error)
        what = f"{type(error).__name__}: {reason}"
        if not announced and what not in told and len(told) < 50:
            told.add(what)
            print(f"{time.time():.3f} not granted: {what}", file=sys.stderr, flush=True)

    async def forget_unconfirmed(holder: str) -> None:
        while True:
            try:
                for ticket in await manager.active(PROVIDER):
                    if ticket.holder_id == holder:
                        await manager.release(PROVIDER, ticket.ticket_id)
                return
            except StoreError:
                await asyncio.sleep(PAUSE)

    async def claimer(index: int, footprint: int) -> None:
        nonlocal announced
        for round_ in range(rounds):
            holder = f"p{seed}-{index}-{round_}"
            while True:
                try:
                    ticket = await manager.claim(PROVIDER, "m", footprint, holder)
                    break
                except (ClaimRejected, ClaimConflict) as error:
                    not_granted(error)
                    await asyncio.sleep(PAUSE)
                except StoreError as error:  # unconfirmed: it may or may not have been written
                    not_granted(error)
                    await forget_unconfirmed(holder)
                    await asyncio.sleep(PAUSE)
            granted = time.time()
            if not announced:
                announced = True
                print("running", flush=True)
            await asyncio.sleep(PAUSE)
            released = time.time()
            while True:
                try:
                    await manager.release(PROVIDER, ticket.ticket_id)
                    break
                except StoreError:
                    await asyncio.sleep(PAUSE)
            intervals.append((granted, released, footprint))

    await asyncio.gather(*(claimer(i, f) for i, f in enumerate(footprints)))
    print(json.dumps({"intervals": intervals}), flush=True)
    await kv.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
