"""The NATS server stops and comes back mid-run: clients reconnect and carry on."""

from __future__ import annotations

import asyncio
import random

import pytest

from kubemoot.clock import ManualClock, SystemClock
from kubemoot.runtime.capacity import CapacityWatch
from kubemoot.runtime.tickets import ClaimConflict, ClaimRejected, TicketManager
from kubemoot.settings import NatsSettings
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV
from kubemoot.store.protocol import StoreError
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.state import GIB, provider_state
from tests.store.test_tickets import PROVIDER


@pytest.fixture
def own_server(nats: NatsServer) -> NatsServer:
    """A server of this test's own: restarting it must not disturb other tests."""
    return nats


async def connect(server: NatsServer) -> NatsKV:
    settings = NatsSettings(
        servers=[server.url], reconnect_wait=0.2, max_reconnect_attempts=-1, request_timeout=1.0
    )
    return await NatsKV.connect(settings)


@pytest.mark.slow
async def test_clients_reconnect_claims_continue_and_watchers_resume(
    own_server: NatsServer,
) -> None:
    ttl = 3.0
    clock = SystemClock()
    clients = [await connect(own_server) for _ in range(2)]
    try:
        managers = []
        for index, kv in enumerate(clients):
            tickets = await kv.bucket("kubemoot_provider_tickets", max_age=600)
            states = await kv.bucket("kubemoot_provider_state", max_age=600)
            managers.append(TicketManager(tickets, states, clock=clock, ttl_seconds=ttl,
                                          rng=random.Random(index)))
        await states.put(
            encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=16 * GIB).to_json()
        )
        watch = CapacityWatch(states, tickets, clock=clock)
        await watch.start()

        phase = {"name": "before"}
        successes = {"before": 0, "down": 0, "after": 0}
        # Set by the claimers: one claim before the restart, five after it.
        served = {"before": asyncio.Event(), "after": asyncio.Event()}
        enough = {"before": 1, "after": 5}
        stop = asyncio.Event()

        async def claimer(manager: TicketManager, index: int) -> None:
            while not stop.is_set():
                try:
                    ticket = await manager.claim(PROVIDER, "m", 2 * GIB, f"h{index}")
                    name = phase["name"]
                    successes[name] += 1
                    if name in served and successes[name] >= enough[name]:
                        served[name].set()
                    await manager.release(PROVIDER, ticket.ticket_id)
                except (StoreError, ClaimConflict, ClaimRejected):
                    # A client's own back-off while the store is away (part of the load).
                    await asyncio.sleep(0.05)

        async def until_served(name: str) -> None:
            try:  # generous: a loaded machine may be slow to the first claim
                await asyncio.wait_for(served[name].wait(), 30)
            except TimeoutError:
                raise AssertionError(f"claims {name} the restart: {successes[name]} of the "
                                     f"{enough[name]} awaited") from None

        workers = [asyncio.create_task(claimer(m, i)) for i, m in enumerate(managers * 2)]
        await until_served("before")
        phase["name"] = "down"
        await own_server.restart(down_for=1.0)
        phase["name"] = "after"
        await until_served("after")  # claims continue once the clients are back
        stop.set()
        await asyncio.gather(*workers)

        # the watcher resumed: a fresh change after the restart moves its counter
        for _ in range(20):
            seen = watch.counter
            await states.put(
                encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=16 * GIB).to_json()
            )
            try:
                await watch.changed_since(seen, 0.5)
                break
            except TimeoutError:
                continue
        else:
            pytest.fail("the capacity watch did not resume after the restart")
        await watch.close()

        # No ticket outlives its TTL, whatever a write cut off by the restart left behind:
        # read the document as a manager would a TTL from now (every claimer has stopped,
        # so nothing writes it any more).
        later = ManualClock(clock.now() + ttl + 0.2)
        assert await TicketManager(tickets, states, clock=later).active(PROVIDER) == []
        document, _ = await managers[0].read(PROVIDER)
        assert all(t.expires_at - t.started_at <= ttl + 1e-6 for t in document.tickets)
    finally:
        for kv in clients:
            await kv.close()
