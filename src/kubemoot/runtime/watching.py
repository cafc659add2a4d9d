"""Following buckets: the watches of one component and the tasks that read them.

The provider view and the capacity watch both keep shared state current by watching
the provider-state and ticket buckets. Opening is all or nothing (a component with half
its watches would miss changes without knowing it), and closing always finishes: a
watch that fails to close is being dropped anyway, so that is logged and counted, never
raised.

Both see every change of a ticket document, so they share one parse of each revision
(:class:`ParsedDocuments`): a claim or release costs one parse per process, not two,
and none for a revision this process's ticket manager wrote (it hands over the
document it encoded).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Generic, TypeVar, cast

from kubemoot.runtime import faults
from kubemoot.store.protocol import Bucket, Watch

__all__ = ["Followers", "ParsedDocuments"]

_D = TypeVar("_D")


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


class ParsedDocuments(Generic[_D]):
    """The documents of one bucket by key, each revision parsed once for every reader.

    Only the newest revision parsed per key is kept. A value that does not parse keeps
    its error, raised to every reader that asks for that revision, so each reader still
    handles an unreadable document in its own way. Readers must not change what they
    get: it is shared.
    """

    def __init__(self, parse: Callable[[bytes], _D]) -> None:
        self._parse = parse
        self._held: dict[str, tuple[int, _D | ValueError]] = {}
        # Per key, the newest revision another process wrote for this one (a combiner
        # that applied its claim or release), known without its document.
        self._heard: dict[str, int] = {}

    def of(self, key: str, revision: int, value: bytes) -> _D:
        """The document ``value`` (revision ``revision`` of ``key``); ``ValueError``
        when it does not parse."""
        held = self._held.get(key)
        if held is not None and held[0] == revision:
            found = held[1]
        else:
            try:
                found = self._parse(value)
            except ValueError as error:
                found = error
            if held is None or held[0] < revision:
                self._held[key] = (revision, found)
        # issubclass(type(...)): isinstance() reads a pydantic document's __class__
        # through the slot hook its __getattr__ puts on the class (once per read here)
        if issubclass(type(found), ValueError):
            # raised again: no trail of earlier raises
            raise cast(ValueError, found).with_traceback(None)
        return cast(_D, found)

    def revision(self, key: str) -> int:
        """The newest revision of ``key`` held (parsed or primed) or heard of; 0 when
        none is.

        It only grows: an older revision is never held over a newer one."""
        held = self._held
        known = held[key][0] if key in held else 0
        heard = self._heard
        if key in heard and heard[key] > known:
            return heard[key]
        return known

    def heard(self, key: str, revision: int) -> None:
        """Know that revision ``revision`` of ``key`` exists without its document:
        another process wrote it for this one (a combiner applying its claim), so the
        document is not in hand, yet :meth:`revision` must not fall behind it. Whoever
        needs the document gets it from the watch, which delivers that revision or a
        later one."""
        heard = self._heard
        if heard.get(key, 0) < revision:
            heard[key] = revision

    def prime(self, key: str, revision: int, document: _D) -> None:
        """Hold ``document`` as revision ``revision`` of ``key`` without parsing: its
        writer has it in hand, and it is what the written value parses to. Readers of
        that revision get it (as shared as a parsed one); an older revision is not
        held over a newer one."""
        held = self._held.get(key)
        if held is None or held[0] < revision:
            self._held[key] = (revision, document)
