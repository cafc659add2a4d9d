"""A claimer process for the NATS cluster test: claims and releases through any server.

``python _cluster_claimer.py URLS TICKETS STATES SEED ROUNDS FOOTPRINT…`` runs one task
per footprint; each claims a ticket, holds it briefly, releases it, and again. It prints
``running`` after its first grant and goes on until a line arrives on its stdin (the
test writes one once it has killed a server); then each task does ``ROUNDS`` more claims
and the process prints one JSON line: the (granted, released, footprint) intervals. So
every claimer is still claiming when the server dies, and each must be granted again
after it.

A claim or release the store could not confirm (a server died under it) is retried; a
claim whose answer was lost is reconciled by releasing any ticket of its own holder id
it does not know it holds, so nothing leaks. On stderr it says which server it talks to
and each distinct reason it was not granted (before its first grant, and after the
kill), so a claimer that stalls explains itself in the test's failure message.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from kubemoot.clock import SystemClock
from kubemoot.runtime.tickets import ClaimConflict, ClaimRejected, TicketManager
from kubemoot.settings import NatsSettings
from kubemoot.store.nats import NatsKV
from kubemoot.store.protocol import StoreError

PROVIDER = "gpu-a"
PAUSE = 0.002  # seconds between two tries, so a retry loop does not spin
TOLD_AT_MOST = 50  # distinct refusal reasons reported per phase: bounded output


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
    killed = asyncio.Event()
    told: dict[str, set[str]] = {"before the first grant": set(), "after the kill": set()}

    async def await_kill() -> None:
        await asyncio.to_thread(sys.stdin.readline)
        print(f"{time.time():.3f} told a server was killed", file=sys.stderr, flush=True)
        killed.set()

    def not_granted(error: Exception) -> None:
        phase = "after the kill" if killed.is_set() else (
            None if announced else "before the first grant")
        if phase is None:
            return
        reason = error.reason if isinstance(error, ClaimRejected) else str(error)
        what = f"{type(error).__name__}: {reason}"
        if what not in told[phase] and len(told[phase]) < TOLD_AT_MOST:
            told[phase].add(what)
            print(f"{time.time():.3f} not granted ({phase}): {what}", file=sys.stderr,
                  flush=True)

    async def forget_unconfirmed(holder: str) -> None:
        while True:
            try:
                for ticket in await manager.active(PROVIDER):
                    if ticket.holder_id == holder:
                        await manager.release(PROVIDER, ticket.ticket_id)
                return
            except StoreError:
                await asyncio.sleep(PAUSE)

    async def claim_once(holder: str, footprint: int) -> None:
        nonlocal announced
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

    async def claimer(index: int, footprint: int) -> None:
        count = 0
        while not killed.is_set():
            await claim_once(f"p{seed}-{index}-{count}", footprint)
            count += 1
        for _ in range(rounds):
            await claim_once(f"p{seed}-{index}-{count}", footprint)
            count += 1

    listener = asyncio.get_running_loop().create_task(await_kill())
    await asyncio.gather(*(claimer(i, f) for i, f in enumerate(footprints)))
    await listener
    print(json.dumps({"intervals": intervals}), flush=True)
    await kv.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
