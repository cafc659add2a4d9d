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

A process that never loses a race (one process alone on the embedded store, the
simulator) never opens this watch.
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


class TicketDocuments:
    """The ticket bucket's watch, and the followed documents it keeps current."""

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket
        self._followed: dict[str, Followed] = {}
        self._task: asyncio.Task[None] | None = None
        self._watch: Watch | None = None

    @property
    def following(self) -> bool:
        return self._task is not None and not self._task.done()

    def follow(self, key: str, wake: asyncio.Event) -> Followed:
        """Keep ``key``'s newest revision from now on (the watch starts with the first)."""
        followed = self._followed.get(key)
        if followed is None:
            followed = self._followed[key] = Followed(wake=wake)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._read())
        return followed

    def noted(self, key: str, value: bytes | None, revision: int) -> None:
        """A revision this process wrote or read itself (the watch may deliver it later)."""
        followed = self._followed.get(key)
        if followed is not None and revision > followed.revision:
            followed.value, followed.revision = value, revision

    async def _read(self) -> None:
        watch = self._watch = self._bucket.watch()
        try:
            await watch.ready()
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
            faults.noted(_SITE, faults.STORE, "following the ticket documents", error)
        finally:
            self._watch = None

    async def aclose(self) -> None:
        watch, task = self._watch, self._task
        if watch is not None:
            await watch.aclose()
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
