"""The newest revision of each ticket document a process writes, from a watch.

Under contention a ticket manager used to read a provider's ticket document before
every compare-and-set it tried after a lost race, and an announcer learned that another
process had served it only after that writer deleted its announcement, the deletion
reached it, and it read the document. Both waits are for a revision that the server
pushes to a watch anyway. Once a process has lost a race, its ticket manager follows
the ticket bucket here and keeps, per provider it writes, the newest document as
delivered (raw bytes: it is parsed only when a write or an answer needs it). A loser
then tries its next compare-and-set on that revision without reading, and an announced
claim is answered as soon as a delivered revision carries its ticket.

The same follower keeps the provider-state bucket's revision of each provider the
lane lost a race on: a lost race used to make every later try of the claim read the
provider state first (about 2.6 reads per granted claim with twenty processes), though
the state rarely changes while claims race. A grant on the delivered state is as sound
as one on the state the caller's provider view holds (that view follows the same
bucket); a "no" on it is confirmed on a freshly read state before anyone hears it.

A process that never loses a race (one process alone on the embedded store, the
simulator) never opens these watches.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from kubemoot.runtime import faults
from kubemoot.store.protocol import Bucket, StoreError, Watch

__all__ = ["Followed", "TicketDocuments"]

_SITE = "ticket-documents"


@dataclass(eq=False)
class Followed:
    """One provider's ticket document as last delivered: its value (None: deleted) and
    revision, and an event set at each delivery."""

    value: bytes | None = None
    revision: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # Also set at each delivery (the lane's own wake, for announcers waiting on it).
    wake: asyncio.Event | None = None
    # The value parsed, by the reader that needed it, with the revision it was parsed
    # at: one parse per delivered revision however many tries use it.
    parsed: tuple[int, object] | None = None


class TicketDocuments:
    """A bucket's watch (the ticket bucket's, or the provider states'), and the
    followed documents it keeps current."""

    def __init__(self, bucket: Bucket, what: str = "ticket documents") -> None:
        self._bucket = bucket
        self._what = what  # in fault log lines
        self._followed: dict[str, Followed] = {}
        self._task: asyncio.Task[None] | None = None
        self._watch: Watch | None = None
        self._ready = False

    @property
    def following(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def ready(self) -> bool:
        """Whether the watch is set up: every change from now on will be delivered, so
        a revision read now stays current until a newer one arrives."""
        return self._ready and self.following

    def follow(self, key: str, wake: asyncio.Event | None = None) -> Followed:
        """Keep ``key``'s newest revision from now on (the watch starts with the first)."""
        followed = self._followed.get(key)
        if followed is None:
            followed = self._followed[key] = Followed(wake=wake)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._read())
        return followed

    async def forget(self, key: str) -> None:
        """Stop keeping ``key`` (a later :meth:`follow` starts from nothing); with no key
        left, stop watching: every delivery of the bucket wakes the process."""
        self._followed.pop(key, None)
        if not self._followed:
            await self.aclose()
            self._task = None

    def noted(self, key: str, value: bytes | None, revision: int, *,
              parsed: object = None) -> None:
        """A revision this process wrote or read itself (the watch may deliver it later);
        ``parsed``: its value already parsed."""
        followed = self._followed.get(key)
        if followed is not None and revision > followed.revision:
            followed.value, followed.revision = value, revision
            followed.parsed = None if parsed is None else (revision, parsed)

    async def _read(self) -> None:
        watch = self._watch = self._bucket.watch()
        try:
            await watch.ready()
            self._ready = True
            async for change in watch:
                followed = self._followed.get(change.key)
                if followed is None or change.revision <= followed.revision:
                    continue
                followed.value, followed.revision = change.value, change.revision
                followed.changed.set()
                if followed.wake is not None:
                    followed.wake.set()
        except StoreError as error:
            # Without the watch every attempt reads first, as before; the next lost race
            # tries to follow again.
            faults.noted(_SITE, faults.STORE, f"following the {self._what}", error)
        finally:
            self._watch = None
            self._ready = False

    async def aclose(self) -> None:
        watch, task = self._watch, self._task
        if watch is not None:
            await watch.aclose()
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
