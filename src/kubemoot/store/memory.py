"""The embedded, in-process store: the default for one process.

It keeps the semantics of the NATS store so that code tested here behaves the same
against JetStream: one revision sequence per bucket (like a stream's sequence),
compare-and-set by revision, per-key TTL set on create, a bucket ``max_age`` counted
from each write, and watches that deliver only changes made after they start.

Expiry is judged lazily against the injected clock, so a :class:`ManualClock` can age
entries without sleeping. An expired entry reads as absent and produces no watch event
(JetStream without limit markers does not announce expiry either).
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Sequence

from kubemoot.clock import Clock, SystemClock
from kubemoot.store._watch import QueueWatch
from kubemoot.store.protocol import (
    Change,
    Entry,
    KeyExists,
    RevisionMismatch,
    StoreUnavailable,
)

__all__ = ["MemoryBucket", "MemoryKV"]


#: A key's item: its entry, made once per write (every read of this revision hands out
#: the same frozen entry), and when it expires. A tuple: a write makes one, and a
#: class's constructor is a frame more on the simulator's most frequent operation.
_Item = tuple[Entry, float | None]


class MemoryBucket:
    """One bucket of a :class:`MemoryKV`."""

    def __init__(self, name: str, *, clock: Clock, max_age: float | None) -> None:
        self.name = name
        self._clock = clock
        self._max_age = max_age
        self._items: dict[str, _Item] = {}
        #: The present keys in order, kept up to date by every write and removal, so a
        #: listing is a copy, not a sort (the demand board lists its bucket, about 130
        #: keys on fleet-16, on every placement round). Expired keys leave it at the
        #: next listing after ``_next_expiry``, the earliest any item may expire.
        self._sorted: list[str] = []
        self._next_expiry = math.inf
        self._sequence = 0
        self._watchers: set[QueueWatch] = set()
        self._watching: tuple[QueueWatch, ...] = ()  # the watchers, as a write walks them
        self._closed = False

    # -- internals -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable(f"bucket {self.name!r}: the store is closed")

    def _live(self, key: str, now: float | None = None) -> _Item | None:
        """The key's item unless it expired (``now``: the time, when the caller has it)."""
        item = self._items.get(key)
        if item is None:
            return None
        if item[1] is not None and item[1] <= (self._clock.now() if now is None else now):
            self._forget(key)
            return None
        return item

    def _forget(self, key: str) -> None:
        del self._items[key]
        del self._sorted[bisect.bisect_left(self._sorted, key)]

    def _write(self, key: str, value: bytes | None, *, ttl: float | None = None) -> int:
        self._sequence += 1
        revision = self._sequence
        if value is None:
            if key in self._items:
                self._forget(key)
        else:
            lifetime = ttl if ttl is not None else self._max_age
            expires_at = None if lifetime is None else self._clock.now() + lifetime
            if key not in self._items:
                bisect.insort(self._sorted, key)
            self._items[key] = (Entry(key, value, revision), expires_at)
            if expires_at is not None and expires_at < self._next_expiry:
                # an overwritten item's earlier expiry may stay the bound: a sweep at
                # that time finds nothing to remove and sets the bound right
                self._next_expiry = expires_at
        if self._watching:
            change = Change(self.name, key, value, revision)
            for watch in self._watching:
                watch.push(change)
        return revision

    # -- Bucket protocol -------------------------------------------------------------

    def _entry(self, key: str, now: float | None = None) -> Entry | None:
        item = self._live(key, now)
        return None if item is None else item[0]

    def _entries(self, keys: Sequence[str]) -> list[Entry | None]:
        """What :meth:`_entry` answers for each key, in one loop: two calls per key
        saved on the demand board's read of some fifty keys per placement round."""
        now = self._clock.now()
        items = self._items
        entries: list[Entry | None] = []
        for key in keys:
            item = items.get(key)
            if item is None:
                entries.append(None)
            elif item[1] is not None and item[1] <= now:
                self._forget(key)  # as _live does: an expired item leaves on a read
                entries.append(None)
            else:
                entries.append(item[0])
        return entries

    async def get(self, key: str) -> Entry | None:
        if self._closed:  # asked here, not in a call: a call fewer per operation
            self._check_open()
        return self._entry(key)

    async def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        """The entries of ``keys``, in order: what ``asyncio.gather`` of one
        :meth:`get` per key answers, without a task per key.

        The answer comes in the same loop turns as that gather's (the keys are read on
        the next turn, the caller resumes two turns later), so code that switches to it
        interleaves with other tasks exactly as before; only the per-key tasks and
        their callbacks are saved. A reader of many small keys (the demand board reads
        every entry per placement round) spends most of its time on those.
        """
        if not keys:
            return []  # a gather of nothing is done at once: no turn passes either
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[Entry | None]] = loop.create_future()

        def read() -> None:  # where the gather's tasks would run
            try:
                if self._closed:
                    self._check_open()
                entries = self._entries(keys)
            except StoreUnavailable as error:
                loop.call_soon(_fail, answer, error)
            else:
                loop.call_soon(_answer, (answer, entries))  # where its last task reports

        loop.call_soon(read)
        return await answer

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        if self._closed:
            self._check_open()
        if self._live(key) is not None:
            raise KeyExists(f"bucket {self.name!r}: key {key!r} already exists")
        return self._write(key, value, ttl=ttl)

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        if self._closed:
            self._check_open()
        item = self._live(key)
        current = 0 if item is None else item[0].revision
        if current != expected_revision or item is None:
            raise RevisionMismatch(
                f"bucket {self.name!r}: key {key!r} is at revision {current}, "
                f"not {expected_revision}"
            )
        return self._write(key, value)

    async def put(self, key: str, value: bytes) -> int:
        if self._closed:
            self._check_open()
        return self._write(key, value)

    async def delete(self, key: str, *, expected_revision: int | None = None) -> None:
        if self._closed:
            self._check_open()
        item = self._live(key)
        if expected_revision is not None:
            current = 0 if item is None else item[0].revision
            if current != expected_revision:
                raise RevisionMismatch(
                    f"bucket {self.name!r}: key {key!r} is at revision {current}, "
                    f"not {expected_revision}"
                )
        # Like a KV delete marker, a delete is a change even when nothing was there.
        self._write(key, None)

    async def keys(self) -> list[str]:
        if self._closed:
            self._check_open()
        now = self._clock.now()  # one reading for all: a listing is one instant
        if now >= self._next_expiry:  # something may have expired: sweep it out
            for key in list(self._sorted):
                self._live(key, now)
            self._next_expiry = min(
                (item[1] for item in self._items.values() if item[1] is not None),
                default=math.inf)
        return list(self._sorted)

    def watch(self) -> QueueWatch:
        if self._closed:
            self._check_open()

        async def stop(watch: QueueWatch) -> None:
            self._watchers.discard(watch)
            self._watching = tuple(self._watchers)

        # Registered now, not on first iteration, so "after now" means after this call.
        watch = QueueWatch(stop=stop)
        self._watchers.add(watch)
        self._watching = tuple(self._watchers)
        return watch

    def close(self) -> None:
        self._closed = True
        for watch in list(self._watchers):
            watch.end()
        self._watchers.clear()
        self._watching = ()


def _answer(answered: tuple[asyncio.Future[list[Entry | None]], list[Entry | None]]) -> None:
    # One argument: the virtual loop calls a callback of one argument without the
    # list and tuple of a ``*args`` call.
    future, entries = answered
    if not future.done():  # the reader may have been cancelled meanwhile
        future.set_result(entries)


def _fail(future: asyncio.Future[list[Entry | None]], error: StoreUnavailable) -> None:
    if not future.done():
        future.set_exception(error)


class MemoryKV:
    """An in-process :class:`~kubemoot.store.protocol.KV` (asyncio, one event loop)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._buckets: dict[str, MemoryBucket] = {}
        self._closed = False

    async def bucket(self, name: str, *, max_age: float | None = None) -> MemoryBucket:
        """Open a bucket, creating it when missing; an existing one keeps its max age."""
        if self._closed:
            raise StoreUnavailable("the store is closed")
        found = self._buckets.get(name)
        if found is None:
            found = MemoryBucket(name, clock=self._clock, max_age=max_age)
            self._buckets[name] = found
        return found

    async def close(self) -> None:
        self._closed = True
        for bucket in self._buckets.values():
            bucket.close()
