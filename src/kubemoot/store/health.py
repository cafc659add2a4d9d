"""Is the shared store still answering? A periodic cheap question, for long-running users.

A watch cannot tell a quiet fleet from a lost store, and a NATS client keeps trying to
reconnect behind the scenes without saying so. :class:`StoreHealth` reads a key nobody
writes every ``every`` seconds; no answer within that time (or a store error) marks the
store lost, the next answer marks it back, and each change of state calls the
listeners once. The dashboard shows it (and fails ``/healthz``); ``kubemoot demo``
prints one line for it instead of one line per failed operation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kubemoot.clock import Clock
from kubemoot.store.protocol import Bucket, StoreError

__all__ = ["CHECK_KEY", "StoreHealth"]

# A key nobody writes: reading it is the cheapest question a store can answer.
CHECK_KEY = "kubemoot-store-check"

Listener = Callable[["StoreHealth"], Awaitable[None]]


class StoreHealth:
    """Whether a store answers, judged by reading one key of ``bucket`` now and then."""

    def __init__(self, bucket: Bucket, *, clock: Clock, every: float) -> None:
        if every <= 0:
            raise ValueError("a store check needs a positive interval")
        self._bucket = bucket
        self._clock = clock
        self.every = every
        self.lost_since: float | None = None
        self.reason = ""
        self._listeners: list[Listener] = []

    @property
    def reachable(self) -> bool:
        return self.lost_since is None

    def on_change(self, listener: Listener) -> None:
        """Await ``listener(self)`` each time the store is lost or back.

        A listener that raises a :class:`StoreError` while the store comes back (it
        was catching up and the store went away again) keeps the store lost.
        """
        self._listeners.append(listener)

    async def check(self) -> bool:
        """Ask once; tell the listeners when the answer changes the state."""
        try:
            await self._clock.wait_for(self._bucket.get(CHECK_KEY), self.every)
        except (StoreError, TimeoutError) as error:
            await self._lose(str(error) or f"no answer within {self.every:g} s")
            return False
        if self.lost_since is not None:
            self.lost_since, self.reason = None, ""
            try:
                await self._tell()
            except StoreError as error:
                await self._lose(str(error))
                return False
        return True

    async def run(self) -> None:
        """Check every ``every`` seconds until cancelled."""
        task = asyncio.current_task()
        while True:
            await self.check()
            # Python 3.11's wait_for drops a cancellation that lands as the awaited read
            # completes; without this the loop would outlive whoever cancelled it.
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            await self._clock.sleep(self.every)

    async def _lose(self, reason: str) -> None:
        first = self.lost_since is None
        self.reason = reason
        if first:
            self.lost_since = self._clock.now()
            await self._tell()

    async def _tell(self) -> None:
        for listener in list(self._listeners):
            await listener(self)
