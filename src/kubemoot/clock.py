"""Injected time.

Runtime code never reads the wall clock or sleeps directly: it asks a :class:`Clock`.
That is the seam that lets the simulator run the production runtime in virtual time
and lets tests jump time without sleeping. This module imports nothing else of ours.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """Where the runtime gets the time and how it waits."""

    def now(self) -> float:
        """Seconds since the Unix epoch (virtual under the simulator)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait this many seconds of this clock's time."""
        ...

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        """Await with a timeout in this clock's time; raises ``TimeoutError``."""
        ...


class SystemClock:
    """Wall-clock time and real asyncio sleeps."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        return await asyncio.wait_for(awaitable, timeout)


class LoopClock:
    """Time read from the running event loop, anchored to an epoch.

    Under a virtual-time event loop (the simulator's) ``now()`` advances in virtual
    time while asyncio sleeps and timeouts cost nothing real; under a normal loop it
    tracks the wall clock.
    """

    def __init__(self, *, epoch: float | None = None) -> None:
        self._epoch = time.time() if epoch is None else epoch
        self._anchor: float | None = None

    def _loop_time(self) -> float:
        loop_time = asyncio.get_running_loop().time()
        if self._anchor is None:
            self._anchor = loop_time
        return loop_time - self._anchor

    def now(self) -> float:
        try:
            return self._epoch + self._loop_time()
        except RuntimeError:  # no running loop: time stands at the anchor
            return self._epoch

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        return await asyncio.wait_for(awaitable, timeout)


class ManualClock:
    """A clock that moves only when told to (tests and snapshots).

    ``sleep`` advances the clock by the requested amount and yields once, so code that
    sleeps finishes at once while still seeing time pass.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def set(self, value: float) -> None:
        self._now = value

    def advance(self, seconds: float) -> None:
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self._now += max(0.0, seconds)
        await asyncio.sleep(0)

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        return await asyncio.wait_for(awaitable, timeout)
