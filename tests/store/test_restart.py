"""The NATS server stops and comes back mid-run: clients reconnect and carry on."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from kubemoot.clock import SystemClock
from kubemoot.runtime.capacity import CapacityWatch
from kubemoot.runtime.tickets import ClaimConflict, ClaimRejected, TicketManager
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV, NatsSettings
from kubemoot.store.protocol import StoreError
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.state import GIB, provider_state
from tests.store.test_tickets import PROVIDER


@pytest.fixture
async def own_server() -> AsyncIterator[NatsServer]:
    """A server of this test's own: restarting it must not disturb other tests."""
    server = NatsServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


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
        stop = asyncio.Event()

        async def claimer(manager: TicketManager, index: int) -> None:
            while not stop.is_set():
                try:
                    ticket = await manager.claim(PROVIDER, "m", 2 * GIB, f"h{index}")
                    successes[phase["name"]] += 1
                    await manager.release(PROVIDER, ticket.ticket_id)
                except (StoreError, ClaimConflict, ClaimRejected):
                    await asyncio.sleep(0.05)  # the store is away: try again shortly

        workers = [asyncio.create_task(claimer(m, i)) for i, m in enumerate(managers * 2)]
        for _ in range(600):  # up to 30 s: a loaded machine may be slow to the first claim
            if successes["before"] > 0:
                break
            await asyncio.sleep(0.05)
        assert successes["before"] > 0, "no claim succeeded before the restart"
        phase["name"] = "down"
        await own_server.restart(down_for=1.0)
        phase["name"] = "after"
        await asyncio.sleep(0.2)
        for _ in range(150):  # claims continue once the clients are back
            if successes["after"] >= 5:
                break
            await asyncio.sleep(0.1)
        assert successes["before"] > 0
        assert successes["after"] >= 5
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

        # no ticket outlives its TTL, whatever a write cut off by the restart left behind
        await asyncio.sleep(ttl + 0.2)
        assert await managers[0].active(PROVIDER) == []
        document, _ = await managers[0].read(PROVIDER)
        assert all(t.expires_at - t.started_at <= ttl + 1e-6 for t in document.tickets)
    finally:
        for kv in clients:
            await kv.close()
