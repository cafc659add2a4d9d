"""Fixtures of the shared-state suite: a real nats-server, and both stores."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from kubemoot.clock import Clock, ManualClock, SystemClock
from kubemoot.store.memory import MemoryKV
from kubemoot.store.nats import NatsKV, NatsSettings
from kubemoot.store.protocol import KV, Bucket
from kubemoot.testing.nats_server import NatsServer

_names = itertools.count()


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """One real ``nats-server -js`` for the session (tests use distinct bucket names)."""
    server = NatsServer()
    # A thread of its own: the first user may already run inside an event loop.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, server.start()).result()
        try:
            yield server.url
        finally:
            thread.submit(asyncio.run, server.close()).result()


@dataclass
class StoreUnderTest:
    """A store plus how time passes for it: virtual for memory, real for NATS."""

    kind: str
    kv: KV
    clock: Clock
    age: Callable[[float], Awaitable[None]]  # let this many seconds pass for expiry

    def name(self, base: str) -> str:
        return f"{base}_{next(_names)}"

    async def bucket(self, base: str, *, max_age: float | None = 600.0) -> Bucket:
        return await self.kv.bucket(self.name(base), max_age=max_age)


async def make_store(kind: str, nats_url: str | None) -> StoreUnderTest:
    if kind == "memory":
        clock = ManualClock(1_700_000_000.0)

        async def advance(seconds: float) -> None:
            clock.advance(seconds)

        return StoreUnderTest("memory", MemoryKV(clock), clock, advance)
    assert nats_url is not None
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)

    return StoreUnderTest("nats", kv, SystemClock(), sleep)


@pytest.fixture(params=["memory", "nats"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StoreUnderTest]:
    """The contract suite runs every test once per store."""
    url = request.getfixturevalue("nats_url") if request.param == "nats" else None
    under_test = await make_store(request.param, url)
    try:
        yield under_test
    finally:
        await under_test.kv.close()
