"""Following buckets: the watches of one component and the tasks that read them.

The provider view and the capacity watch both keep shared state current by watching
the provider-state and ticket buckets. Opening is all or nothing (a component with half
its watches would miss changes without knowing it), and closing always finishes: a
watch that fails to close is being dropped anyway, so that is logged and counted, never
raised.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from kubemoot.runtime import faults
from kubemoot.store.protocol import Bucket, Watch

__all__ = ["Followers"]


class Followers:
    """Watches on some buckets, each read by a task of its own."""

    def __init__(self, site: str, what: str) -> None:
        self._site = site  # the component's label in fault counts
        self._what = what  # and its name in log lines
        self._watches: list[Watch] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def open(self, buckets: Iterable[Bucket]) -> None:
        """Watch every bucket, ready before this returns.

        Raises :class:`~kubemoot.store.protocol.StoreError` when a watch cannot be set
        up; the watches already opened are closed first.
        """
        try:
            for bucket in buckets:
                watch = bucket.watch()
                self._watches.append(watch)
                await watch.ready()
        except BaseException:
            await self.close()
            raise

    def start(self, follow: Callable[[Watch], Coroutine[Any, Any, None]]) -> None:
        """Read every open watch with ``follow(watch)``, each in a task of its own."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(follow(w)) for w in self._watches]

    async def close(self) -> None:
        """Close the watches and stop their tasks."""
        watches, tasks = self._watches, self._tasks
        self._watches, self._tasks = [], []
        for watch in watches:
            try:
                await watch.aclose()
            except Exception as error:  # being dropped anyway; say so all the same
                faults.noted(self._site, faults.CLEANUP, f"closing a {self._what} watch",
                             error)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
