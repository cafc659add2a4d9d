"""Fixtures of the shared-state suite: a real nats-server, and both stores."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from kubemoot.clock import Clock, ManualClock, SystemClock
from kubemoot.settings import NatsSettings
from kubemoot.store.memory import MemoryKV
from kubemoot.store.nats import NatsKV
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


class MovableWallClock(SystemClock):
    """The wall clock, plus however far a test has moved it ahead.

    What a ticket manager or demand board decides from its clock (a TTL lapsed, a line
    place expired) then happens when the test says, with no real wait, while the
    NATS server and every real sleep keep the wall clock's time.
    """

    def __init__(self) -> None:
        self.ahead = 0.0

    def now(self) -> float:
        return super().now() + self.ahead


@dataclass
class StoreUnderTest:
    """A store plus how time passes for it: virtual for memory, real for NATS."""

    kind: str
    kv: KV
    clock: Clock
    #: Let this many seconds pass on the clock the code under test reads.
    age: Callable[[float], Awaitable[None]]
    #: Let this many seconds pass for the store itself (a key's TTL, a bucket's max
    #: age): on NATS the server expires keys in its own real time, so that is a real wait.
    age_on_server: Callable[[float], Awaitable[None]]

    def name(self, base: str) -> str:
        return f"{base}_{next(_names)}"

    async def bucket(self, base: str, *, max_age: float | None = 600.0) -> Bucket:
        return await self.kv.bucket(self.name(base), max_age=max_age)


async def make_store(kind: str, nats_url: str | None) -> StoreUnderTest:
    if kind == "memory":
        clock = ManualClock(1_700_000_000.0)

        async def advance(seconds: float) -> None:
            clock.advance(seconds)

        return StoreUnderTest("memory", MemoryKV(clock), clock, advance, advance)
    assert nats_url is not None
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    wall = MovableWallClock()

    async def move(seconds: float) -> None:
        wall.ahead += seconds

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)  # the server's expiry is the behaviour under test

    return StoreUnderTest("nats", kv, wall, move, sleep)


@pytest.fixture(params=["memory", "nats"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StoreUnderTest]:
    """The contract suite runs every test once per store."""
    url = request.getfixturevalue("nats_url") if request.param == "nats" else None
    under_test = await make_store(request.param, url)
    try:
        yield under_test
    finally:
        await under_test.kv.close()
