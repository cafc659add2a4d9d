"""What the store sees of one placed call: two writes of its provider's ticket document.

A placement on a warm copy decides on the provider view (followed by watches) and on the
ticket document its lane last wrote, so the claim reads nothing; the release writes once
more. Nothing else goes to the store per call: no read of a state or ticket document, no
demand entry, no new watch. These tests count every operation the runtime sends to each
bucket over a few calls, on both stores (the NATS one on a server of its own, since the
runtime's buckets have fixed names).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from kubemoot.clock import Clock, ManualClock, SystemClock
from kubemoot.runtime.builder import build_runtime
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import NatsSettings
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, PROVIDER_TICKETS_BUCKET
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.nats import NatsKV
from kubemoot.store.protocol import KV, Bucket
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.state import GIB, NOW, provider_state
from tests.store.test_ticket_round_trips import CountingBucket

MODEL = "m"
PROVIDERS = ("gpu-a", "gpu-b")


class CountingKV:
    """A real store whose buckets count the operations sent to them."""

    def __init__(self, inner: KV) -> None:
        self.inner = inner
        self.buckets: dict[str, CountingBucket] = {}

    async def bucket(self, name: str, *, max_age: float | None = None) -> Bucket:
        if name not in self.buckets:
            self.buckets[name] = CountingBucket(await self.inner.bucket(name, max_age=max_age))
        return self.buckets[name]  # type: ignore[return-value]

    async def close(self) -> None:
        await self.inner.close()

    def counts(self) -> dict[str, Counter[str]]:
        return {name: bucket.calls for name, bucket in self.buckets.items()
                if +bucket.calls}

    def reset(self) -> None:
        for bucket in self.buckets.values():
            bucket.calls.clear()


@pytest.fixture(params=["memory", "nats"])
async def counted(request: pytest.FixtureRequest) -> AsyncIterator[tuple[CountingKV, Clock]]:
    clock: Clock
    if request.param == "memory":
        clock = ManualClock(NOW)
        inner: KV = MemoryKV(clock)
        yield CountingKV(inner), clock
        await inner.close()
        return
    server = NatsServer()
    await server.start()
    try:
        inner = await NatsKV.connect(NatsSettings(servers=[server.url]))
        yield CountingKV(inner), SystemClock()
        await inner.close()
    finally:
        await server.close()


async def test_a_warm_placement_and_its_release_are_two_writes_and_nothing_else(
    counted: tuple[CountingKV, Clock],
) -> None:
    kv, clock = counted
    runtime = await build_runtime(kv, clock=clock, declared={MODEL: 2 * GIB})
    states = await kv.bucket(PROVIDER_STATE_BUCKET)
    for name in PROVIDERS:
        await states.put(encode_token(name), provider_state(
            name, usable_mib=16 * GIB, loaded={MODEL: 2 * GIB}, slots=4).to_json())
    await runtime.start(watch=False)
    planner = runtime.planner
    try:
        first = await planner.place([CandidateModel(MODEL, 70)], holder_id="warm-up",
                                    prompt_tokens=100)
        await planner.release(first)
        await asyncio.sleep(0.05)  # the watches deliver the warm-up's writes
        kv.reset()
        calls = 5
        for i in range(calls):
            placement = await planner.place([CandidateModel(MODEL, 70)],
                                            holder_id=f"call-{i}", prompt_tokens=100)
            assert placement.ticket is not None and placement.provider in PROVIDERS
            await planner.release(placement)
        assert kv.counts() == {PROVIDER_TICKETS_BUCKET: Counter(update=2 * calls)}
    finally:
        await runtime.close()
