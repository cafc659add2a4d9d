"""A queue-backed :class:`~kubemoot.store.protocol.Watch` shared by both stores.

A store hands changes to :meth:`QueueWatch.push`; the watch is established by a start
hook on the first :meth:`ready` (or the first iteration), and torn down by a stop hook.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kubemoot.store.protocol import Change

__all__ = ["QueueWatch"]

Hook = Callable[["QueueWatch"], Awaitable[None]]


class QueueWatch:
    """Changes pushed by a store, read with ``async for``."""

    def __init__(self, *, start: Hook | None = None, stop: Hook | None = None) -> None:
        self._queue: asyncio.Queue[Change | None] = asyncio.Queue()
        self._start = start
        self._stop = stop
        self._started = start is None
        self._start_lock = asyncio.Lock()
        self._ended = False

    def push(self, change: Change) -> None:
        if not self._ended:
            self._queue.put_nowait(change)

    def end(self) -> None:
        """End the iteration (the store closed); pending changes are still delivered."""
        if not self._ended:
            self._ended = True
            self._queue.put_nowait(None)

    async def ready(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if not self._started and self._start is not None:
                await self._start(self)
                self._started = True

    async def resume(self) -> None:
        """Establish the watch again (the store's connection was replaced); changes made
        while it was away are not replayed."""
        if self._started and not self._ended and self._start is not None:
            async with self._start_lock:
                await self._start(self)

    def __aiter__(self) -> QueueWatch:
        return self

    async def __anext__(self) -> Change:
        if not self._started:  # checked here: a change read is one coroutine fewer
            await self.ready()
        change = await self._queue.get()
        if change is None:
            self._queue.put_nowait(None)  # later calls end too
            raise StopAsyncIteration
        return change

    async def aclose(self) -> None:
        self.end()
        if self._stop is not None:
            stop, self._stop = self._stop, None
            await stop(self)
