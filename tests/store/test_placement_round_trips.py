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


async def _two_writes_and_nothing_else(inner: KV, clock: Clock) -> None:
    kv = CountingKV(inner)
    runtime = await build_runtime(kv, clock=clock, declared={MODEL: 2 * GIB})
    states = await kv.bucket(PROVIDER_STATE_BUCKET)
    for name in PROVIDERS:
        await states.put(encode_token(name), provider_state(
            name, usable_mib=16 * GIB, loaded={MODEL: 2 * GIB}, slots=4).to_json())
    await runtime.start(watch=False)
    planner = runtime.planner
    try:
        # Warm-up: a call held on each provider (the second goes where the first is not
        # running), so each provider's lane holds the document it wrote: its first
        # claim had to read the document and create it.
        held = [await planner.place([CandidateModel(MODEL, 70)], holder_id=f"warm-up-{i}",
                                    prompt_tokens=100) for i in range(len(PROVIDERS))]
        assert sorted(str(p.provider) for p in held) == sorted(PROVIDERS)
        for placement in held:
            await planner.release(placement)
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


async def test_a_warm_placement_and_its_release_are_two_writes_and_nothing_else() -> None:
    clock = ManualClock(NOW)
    kv = MemoryKV(clock)
    try:
        await _two_writes_and_nothing_else(kv, clock)
    finally:
        await kv.close()


async def test_on_nats_a_warm_placement_and_its_release_are_two_writes_and_nothing_else(
    nats: NatsServer,
) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats.url]))
    try:
        await _two_writes_and_nothing_else(kv, SystemClock())
    finally:
        await kv.close()
