"""The runtime's own claims use the claim line: two runtimes on one real nats-server.

Each runtime stands for an agent pod (a store connection of its own). The first one's
ticket writes all lose their races to a rival, as a slow pod's would. Its claim for a
cold load carries what must still hold (ready, context) as data, so it is announced,
and the second runtime's write, which wins, serves it before its own later claim for
the same memory. Then the second time round: the slow runtime's release loses too, is
announced, and the other runtime's next claim applies it in the same write.
"""

from __future__ import annotations

import asyncio

import pytest

from kubemoot.clock import SystemClock
from kubemoot.runtime.builder import Runtime, build_runtime
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.store import open_store
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    TICKET_REQUESTS_BUCKET,
    AnnouncedRequests,
    ClaimCondition,
    ProviderTickets,
    RequestKind,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import KV, Bucket
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.state import GIB, provider_state
from kubemoot.testing.waiting import until_stored
from tests.store.test_claim_line import LosingBucket

pytestmark = pytest.mark.nats

PROVIDER = "gpu-a"
MODEL = "m:7b"
SMALL = "s:1b"


class LosingTickets:
    """A store whose ticket document this runtime never wins a write on."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv

    async def bucket(self, name: str, *, max_age: float | None = None) -> Bucket:
        bucket = await self.kv.bucket(name, max_age=max_age)
        if name == PROVIDER_TICKETS_BUCKET:
            return LosingBucket(bucket)  # type: ignore[return-value]
        return bucket

    async def close(self) -> None:
        await self.kv.close()


async def runtime(kv: KV) -> Runtime:
    # Announcements live long enough for a loaded machine; 40 lost races before the
    # announcement would end a claim that is not in line.
    settings = RuntimeSettings(claim_request_seconds=60, claim_attempts=40)
    built = await build_runtime(kv, clock=SystemClock(), settings=settings,
                                declared={MODEL: 6 * GIB, SMALL: GIB})
    await built.start(watch=False)
    return built


async def test_two_runtimes_serve_the_earlier_waiter_first(nats: NatsServer) -> None:
    slow_kv, fast_kv = await open_store(nats.url), await open_store(nats.url)
    states = await fast_kv.bucket(PROVIDER_STATE_BUCKET)
    await states.put(encode_token(PROVIDER), provider_state(
        PROVIDER, usable_mib=8 * GIB, context=8192).to_json())
    tickets = await fast_kv.bucket(PROVIDER_TICKETS_BUCKET)
    await tickets.put(encode_token(PROVIDER), ProviderTickets(provider=PROVIDER).to_json())
    requests = await fast_kv.bucket(TICKET_REQUESTS_BUCKET)
    slow = await runtime(LosingTickets(slow_kv))  # type: ignore[arg-type]
    fast = await runtime(fast_kv)
    try:
        waiting = asyncio.create_task(slow.planner.place(
            [CandidateModel(MODEL, 70)], holder_id="slow", prompt_tokens=100))
        announced = await until_stored(
            requests, lambda: fast.tickets.announced(PROVIDER), timeout=30,
            what="the slow runtime's claim announced and seen by the other runtime")
        # The claim's condition travels as data, for the other runtime's write to judge.
        assert [r.kind for r in announced] == [RequestKind.CLAIM]
        assert announced[0].condition == ClaimCondition(prompt_tokens=100)
        keys = await requests.keys()
        entry = await requests.get(keys[0])
        assert entry is not None
        assert AnnouncedRequests.from_json(entry.value).requests[0].condition is not None

        # The fast runtime's write wins, yet the 6 GiB go to the claim that came first.
        later = await fast.planner.place([CandidateModel(MODEL, 70)], holder_id="fast",
                                         prompt_tokens=100)
        assert later.ticket is None
        first = await asyncio.wait_for(waiting, 30)
        assert first.ticket is not None and first.ticket.holder_id == "slow"
        active = await fast.tickets.active(PROVIDER)
        assert [t.ticket_id for t in active] == [first.ticket.ticket_id]

        # The second time: the slow release loses its races as well and is announced;
        # the fast runtime's next claim applies it in the same write.
        releasing = asyncio.create_task(slow.planner.release(first))
        await until_stored(
            requests, lambda: [r for r in fast.tickets.announced(PROVIDER)
                               if r.kind is RequestKind.RELEASE],
            timeout=30, what="the slow release announced and seen by the other runtime")
        # (a small model: the fast runtime's view may still show the big copy loading,
        # and a call for it would queue on that copy without claiming)
        again = await fast.planner.place([CandidateModel(SMALL, 70)], holder_id="fast",
                                         prompt_tokens=100)
        assert again.ticket is not None and again.ticket.holder_id == "fast"
        await asyncio.wait_for(releasing, 30)
        active = await fast.tickets.active(PROVIDER)
        assert [t.ticket_id for t in active] == [again.ticket.ticket_id]
    finally:
        for rt in (slow, fast):
            await rt.close()
        await slow_kv.close()
        await fast_kv.close()
