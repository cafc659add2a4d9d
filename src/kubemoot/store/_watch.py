"""A queue-backed :class:`~kubemoot.store.protocol.Watch` shared by both stores.

A store hands changes to :meth:`QueueWatch.push`; the watch is established by a start
hook on the first :meth:`ready` (or the first iteration), and torn down by a stop hook.
A store may let a reader take each change as it is pushed (:meth:`QueueWatch.hand_over`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from kubemoot.store.protocol import Change, ChangesLost

__all__ = ["DRAINED_BOUND", "QueueWatch"]

#: How many changes a drained watch keeps before it forgets them (see ``drain``).
DRAINED_BOUND = 10_000

Hook = Callable[["QueueWatch"], Awaitable[None]]


class QueueWatch:
    """Changes pushed by a store, read with ``async for`` or taken with :meth:`drain`.

    The pending changes are a deque and each waiting reader a future, as in
    :class:`asyncio.Queue` (a reader wakes on the same loop turn as it would there), but
    without the queue's bookkeeping: every write to a watched bucket pushes here, and
    the embedded store's writes are the simulator's most frequent operation.
    """

    def __init__(self, *, start: Hook | None = None, stop: Hook | None = None,
                 handing: bool = False) -> None:
        # None marks the end: it stays at the head once reached, so later reads end too
        self._pending: deque[Change | None] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._start = start
        self._stop = stop
        self._started = start is None
        self._start_lock = asyncio.Lock()
        self._ended = False
        #: set by the first drain: a drained watch keeps at most this many changes
        self._bound: int | None = None
        self._lost = False
        #: whether :meth:`hand_over` may be used (the store's choice), and to whom
        self._handing = handing
        self._take: Callable[[Change], None] | None = None

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def hand_over(self, take: Callable[[Change], None]) -> bool:
        """See :class:`~kubemoot.store.protocol.HandingWatch`: from now on each change
        goes to ``take`` as it is pushed, the pending ones first (False where the store
        did not allow it)."""
        if not self._handing:
            return False
        pending = self._pending
        while pending and pending[0] is not None:
            take(pending.popleft())  # type: ignore[arg-type]
        self._take = take
        return True

    def push(self, change: Change) -> None:
        if not self._ended:
            if self._take is not None:
                self._take(change)
                return
            pending = self._pending
            if self._bound is not None and len(pending) >= self._bound:
                pending.clear()  # nobody drained for long: forget, and say so on drain
                self._lost = True
            pending.append(change)
            waiters = self._waiters
            while waiters:  # _wake, inline: a call fewer per change a reader waits for
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return

    def end(self) -> None:
        """End the iteration (the store closed); pending changes are still delivered."""
        if not self._ended:
            self._ended = True
            self._pending.append(None)
            if self._waiters:
                self._wake()

    def drain(self) -> list[Change] | None:
        """The changes pending now, in order, without waiting; ``None`` once the watch
        has ended and every change before the end was taken."""
        self._bound = DRAINED_BOUND
        if self._lost:
            self._lost = False
            raise ChangesLost("the watch held more changes than it keeps; read again")
        pending = self._pending
        if not pending:
            return []
        if pending[-1] is not None:
            changes: list[Change] = list(pending)  # type: ignore[arg-type]
            pending.clear()
            return changes
        if len(pending) == 1:
            return None
        # everything up to the end; the end itself stays for every later call
        changes = [change for change in pending if change is not None]
        pending.clear()
        pending.append(None)
        return changes

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
        pending = self._pending
        while not pending:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                # as asyncio.Queue.get: a cancelled reader passes its wake-up on
                waiter.cancel()
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                if pending and not waiter.cancelled():
                    self._wake()
                raise
        change = pending[0]
        if change is None:  # the end stays, so later calls end too
            raise StopAsyncIteration
        pending.popleft()
        return change

    async def aclose(self) -> None:
        self.end()
        if self._stop is not None:
            stop, self._stop = self._stop, None
            await stop(self)
