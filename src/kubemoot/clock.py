"""Injected time.

Runtime code never reads the wall clock or sleeps directly: it asks a :class:`Clock`.
That is the seam that lets the simulator run the production runtime in virtual time
and lets tests jump time without sleeping. This module imports nothing else of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
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

    #: ``time.time`` itself, not a method around it: the gateway asks the time about
    #: twenty-five times per call, and each ask then enters no Python frame.
    now = staticmethod(time.time)

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

    def __init__(self, *, epoch: float | None = None, anchor: float | None = None) -> None:
        self._epoch = time.time() if epoch is None else epoch
        # the loop time that ``epoch`` stands for; by default the first reading
        self._anchor: float | None = anchor

    def now(self) -> float:
        # One frame: the runtime asks the time several times per call (the simulator
        # about fifty thousand times per run).
        try:
            loop_time = asyncio.get_running_loop().time()
        except RuntimeError:  # no running loop: time stands at the anchor
            return self._epoch
        anchor = self._anchor
        if anchor is None:
            anchor = self._anchor = loop_time
        return self._epoch + (loop_time - anchor)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        return await asyncio.wait_for(awaitable, timeout)


class ScaledClock:
    """Emulated time that runs ``1 / scale`` times as fast as the wall clock.

    The Ollama-API emulator counts every duration (loads, unloads, keep-alive, token
    pacing) in emulated seconds; ``scale`` 0.01 makes one emulated second cost ten real
    milliseconds. Scale 0 makes every wait instantaneous and stops emulated time.
    """

    def __init__(self, scale: float = 1.0) -> None:
        if not scale >= 0:
            raise ValueError(f"the time scale must be 0 or more, got {scale!r}")
        self.scale = scale
        self._origin = time.time()
        self._real_origin = time.monotonic()

    def now(self) -> float:
        if self.scale == 0:
            return self._origin
        return self._origin + (time.monotonic() - self._real_origin) / self.scale

    def wall_time(self, emulated: float) -> float:
        """The Unix time at which emulated instant ``emulated`` happens (what answers
        shown to clients carry). With time standing still, the present plus how far
        ahead the instant lies, as if it ran at the wall clock's pace (a keep-alive
        shows as five minutes away, never as already over)."""
        if self.scale == 0:
            return time.time() + (emulated - self._origin)
        return self._origin + (emulated - self._origin) * self.scale

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) * self.scale)

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        return await asyncio.wait_for(
            awaitable, None if timeout is None else max(0.0, timeout) * self.scale)


class ManualClock:
    """A clock that moves only when told to (tests and snapshots).

    ``sleep`` advances the clock by the requested amount and yields once, so code that
    sleeps finishes at once while still seeing time pass. ``wait_for`` times out in
    this clock's time, never in real seconds: the awaitable runs until it finishes or
    until someone moves the clock past the deadline (``advance``, ``set`` or another
    task's ``sleep``). A test therefore decides when a timeout happens instead of
    racing a real timer.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._deadlines: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._watchers: list[asyncio.Future[None]] = []

    def now(self) -> float:
        return self._now

    def set(self, value: float) -> None:
        self._now = value
        self._expire()

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._expire()

    async def sleep(self, seconds: float) -> None:
        self._now += max(0.0, seconds)
        self._expire()
        await asyncio.sleep(0)

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        if timeout is None:
            return await awaitable
        if timeout <= 0:  # asyncio's own rule: only an already finished awaitable counts
            return await asyncio.wait_for(awaitable, 0)
        task = asyncio.ensure_future(awaitable)
        deadline: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self._now + timeout, next(self._order), deadline)
        heapq.heappush(self._deadlines, entry)
        for watcher in self._watchers:
            if not watcher.done():
                watcher.set_result(None)
        self._watchers.clear()
        try:
            await asyncio.wait((task, deadline), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            deadline.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise TimeoutError(f"not done within {timeout:g} s of clock time")

    @property
    def pending_deadlines(self) -> int:
        """How many ``wait_for`` calls are waiting on this clock now."""
        self._deadlines = [d for d in self._deadlines if not d[2].done()]
        heapq.heapify(self._deadlines)
        return len(self._deadlines)

    async def until_waiting(self, count: int = 1) -> None:
        """Return once ``count`` ``wait_for`` calls wait on this clock.

        The event a test waits on before it moves time: the code under test has
        reached its timed wait, so advancing now is what times it out.
        """
        while self.pending_deadlines < count:
            watcher: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._watchers.append(watcher)
            await watcher

    def _expire(self) -> None:
        while self._deadlines and self._deadlines[0][0] <= self._now:
            _, _, deadline = heapq.heappop(self._deadlines)
            if not deadline.done():
                deadline.set_result(None)
