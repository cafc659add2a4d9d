"""A release the store refused is made again once it answers, whoever released.

The ticket manager keeps each release an outage refused and tries it again in the
background until the store answers or the ticket's TTL has reclaimed it. The gateway's
calls had that (tests/gateway/test_release_after_outage.py); here the caller is the
manager's own ``claimed`` block, as a plan held from selection or a pinned load would
be: no call service is involved.
"""

from __future__ import annotations

import pytest

from kubemoot.clock import SystemClock
from kubemoot.runtime.tickets import TicketManager
from kubemoot.settings import NatsSettings
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.state import GIB, provider_state
from kubemoot.testing.waiting import wait_until

pytestmark = pytest.mark.nats


async def test_a_release_refused_by_an_outage_is_made_once_the_store_is_back(
        nats: NatsServer) -> None:
    # two reconnect rounds 0.1 s apart: the client gives up within a second or so
    kv = await NatsKV.connect(NatsSettings(servers=[nats.url], max_reconnect_attempts=2,
                                           reconnect_wait=0.1, request_timeout=1.0,
                                           connect_timeout=0.5))
    tickets = await kv.bucket("tickets")
    states = await kv.bucket("states")
    await states.put(encode_token("gpu-a"),
                     provider_state("gpu-a", usable_mib=8 * GIB).to_json())
    manager = TicketManager(tickets, states, clock=SystemClock(), max_attempts=2)
    try:
        async with manager.claimed("gpu-a", "m", 2 * GIB, "a-held-plan"):
            await nats.stop()
            await wait_until(lambda: kv.connection.is_closed, timeout=60,
                             what="nats-py giving up on its connection")
        # the block ended: its release met the outage (logged, not raised)
        await nats.start()  # the same port and store: the ticket is still there

        async def released() -> bool:
            try:
                entry = await tickets.get(encode_token("gpu-a"))
            except Exception:  # the store still coming back
                return False
            return entry is not None and ProviderTickets.from_json(entry.value).tickets == []

        # well within the ticket's TTL (180 s): only a new release can pass this
        await wait_until(released, timeout=30, what="the ticket the outage kept released")
    finally:
        await manager.aclose()
        await kv.close()
