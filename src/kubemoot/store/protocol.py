"""The key-value protocol every shared-state store implements.

Two implementations pass one contract suite: :mod:`kubemoot.store.memory` (embedded,
in-process, the default for one process) and :mod:`kubemoot.store.nats` (NATS
JetStream KV, the distributed engine). Foreign errors are mapped to the ones below at
the adapter's edge, so nothing above the store ever sees a NATS exception.

Error tree::

    StoreError
    ├── KeyExists           create() on a key that holds a value
    ├── RevisionMismatch    update() when the key moved past the expected revision
    │                       (or is absent); re-read and decide again
    ├── KeyNotFound         an operation that needs an existing key found none
    ├── StoreUnavailable    the store cannot be reached now; retrying later may help
    └── ChangesLost         a drained watch forgot changes past its bound; read again
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kubemoot.frozen import quick_init


class StoreError(Exception):
    """Base of all shared-state errors."""


class KeyExists(StoreError):
    """``create`` found the key already present."""


class RevisionMismatch(StoreError):
    """``update`` lost a compare-and-set race: the key is not at the expected revision."""


class KeyNotFound(StoreError):
    """The key holds no value."""


class StoreUnavailable(StoreError):
    """The store cannot be reached; the operation may succeed later."""


class ChangesLost(StoreError):
    """A watch read by ``drain`` held more changes than it keeps and forgot them: the
    reader reads the bucket again (changes after the loss are still delivered)."""


@quick_init
@dataclass(frozen=True, slots=True)
class Entry:
    """A value and the revision it was written at."""

    key: str
    value: bytes
    revision: int


@quick_init
@dataclass(frozen=True, slots=True)
class Change:
    """One change seen by a watch: a new value, or a deletion (``value is None``)."""

    bucket: str
    key: str
    value: bytes | None
    revision: int


@runtime_checkable
class Watch(Protocol):
    """A stream of :class:`Change`; ends when the store closes or ``aclose`` is called."""

    def __aiter__(self) -> AsyncIterator[Change]: ...

    async def __anext__(self) -> Change: ...

    def drain(self) -> list[Change] | None:
        """The changes that arrived and were not yet read, in order, without waiting
        (a reader that catches up when it needs to, not on every change); ``None`` once
        the watch has ended and every change before the end was taken.

        A watch that has been drained keeps a bounded number of pending changes, so a
        reader that stops asking does not hold memory without end: past the bound it
        forgets them, and the next ``drain`` raises :class:`ChangesLost`."""
        ...

    async def ready(self) -> None:
        """Establish the watch now (idempotent); changes count from the first call."""
        ...

    async def aclose(self) -> None:
        """Stop watching; a pending ``__anext__`` ends the iteration."""
        ...


@runtime_checkable
class HandingWatch(Protocol):
    """A watch that can give its changes to a function as they arrive, instead of
    waking a reader for each (see :meth:`hand_over`)."""

    def hand_over(self, take: Callable[[Change], None]) -> bool:
        """From now on give each change to ``take`` as the store delivers it, those
        not yet read first, in order; iterating the watch then yields only its end.
        ``take`` must not wait or raise. False, and nothing changes, where the store
        keeps a reader's loop turn per change (the embedded store: the simulator's
        decisions follow those turns)."""
        ...


@runtime_checkable
class HandingBucket(Protocol):
    """A bucket that can hand a compare-and-set's outcome to a function in the turn it
    learns it, instead of waking a task that awaits :meth:`Bucket.update` (see
    :meth:`update_then`)."""

    def update_then(self, key: str, value: bytes, expected_revision: int,
                    then: Callable[[int | Exception], None]) -> bool:
        """Send ``update(key, value, expected_revision=expected_revision)`` now and give
        ``then`` its outcome once it is known: the new revision, or the error ``update``
        would raise (a lost race is :class:`RevisionMismatch`). ``then`` is called once,
        never from this call, and must not wait; what it raises is the store's to log.
        False, with nothing sent, when the write cannot go out at once (the caller
        awaits ``update`` then). Only a store whose answers come at the network's moment
        anyway offers it (NATS): the embedded store keeps its writers' loop turns, which
        the simulator's decisions follow."""
        ...


@runtime_checkable
class Bucket(Protocol):
    """One KV bucket. Revisions only grow; compare-and-set is by revision."""

    name: str

    async def get(self, key: str) -> Entry | None:
        """The current entry, or ``None`` when absent (or expired)."""
        ...

    async def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        """The entries of ``keys`` in order (``None`` for each absent one), read
        together: a reader of many keys pays about one round trip, not one per key."""
        ...

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        """Write only if the key is absent; returns the new revision; ``KeyExists``."""
        ...

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        """Write only if the key is at ``expected_revision``; ``RevisionMismatch``."""
        ...

    async def put(self, key: str, value: bytes) -> int:
        """Write unconditionally (for single-writer keys); returns the revision."""
        ...

    async def delete(self, key: str, *, expected_revision: int | None = None) -> None:
        """Remove the key (idempotent); with a revision, only if still at it."""
        ...

    async def keys(self) -> list[str]:
        """All present keys."""
        ...

    def watch(self) -> Watch:
        """Changes after now (not the current values), until the store closes.

        Iterate it with ``async for``; ``await watch.ready()`` first to know at once
        whether the watch could be established (it raises ``StoreUnavailable``).
        """
        ...


@runtime_checkable
class KV(Protocol):
    """A store: named buckets over one connection."""

    async def bucket(self, name: str, *, max_age: float | None = None) -> Bucket:
        """Open a bucket, creating it when missing (``max_age`` in seconds)."""
        ...

    async def close(self) -> None:
        """Release connections and end watches."""
        ...
