"""The entrance to a provider's claim line: requests announced beside the ticket document.

A claimer that loses a compare-and-set race on a provider's ticket document has written
nothing, so no other process can know that it waits, and with one claimer per process
(every agent pod is one) the fastest process wins again and again. Writing its place
into the document would need the very race it lost. So a loser *announces* its request
instead: it creates a key of its own in ``kubemoot_ticket_requests``
(``<provider>.<kind>.<ticketId>``), which no other writer contends for, and the bucket's
revisions order the announcements first come first. Every process that writes ticket
documents follows the bucket and, in its next write of that provider's document,
applies every request announced there, oldest first (:func:`decide`). One write then
serves claimers in many processes, and a claimer that keeps losing is served by
whoever wins.

The announcer keeps trying on its own as well and waits between tries on this watch
(the writer that settles a request deletes its key, which wakes the announcer). This
module keeps the followed requests and the keys; the decision is
:mod:`kubemoot.runtime.ticket_decision`'s, the retries are
:mod:`kubemoot.runtime.tickets`'.
"""

from __future__ import annotations

import asyncio
import logging

from kubemoot.clock import Clock
from kubemoot.runtime import faults
from kubemoot.runtime.watching import Followers
from kubemoot.store.documents import RequestKind, Ticket, TicketRequest
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, Change, StoreError, Watch

__all__ = ["Announcements", "request_key"]

log = logging.getLogger(__name__)

_SITE = "ticket-requests"


def request_key(provider: str, kind: RequestKind, ticket_id: str) -> str:
    """The key of one announced request (KV-safe tokens joined by dots)."""
    return f"{encode_token(provider)}.{kind.value}.{encode_token(ticket_id)}"


class Announcements:
    """This process's view of the announced requests, and its own announcements."""

    def __init__(self, bucket: Bucket, *, clock: Clock, seconds: float) -> None:
        self._bucket = bucket
        self._clock = clock
        self.seconds = seconds  # how long an announcement may be applied
        # provider → key → request, in the order the watch delivered them (announced)
        self._pending: dict[str, dict[str, TicketRequest]] = {}
        self._own: dict[str, asyncio.Event] = {}  # our keys → what wakes their waiter
        self._gone: set[str] = set()  # our keys a writer deleted (settled) already
        self._followers = Followers(_SITE, "ticket-request")
        self._opening: asyncio.Task[None] | None = None
        self._following = False
        self._deletes: set[asyncio.Task[None]] = set()

    # -- following ------------------------------------------------------------------

    def follow(self) -> None:
        """Start following the bucket (once; again after the watch failed or ended)."""
        if self._opening is None or (self._opening.done() and not self._following):
            self._opening = asyncio.get_running_loop().create_task(self._open())

    async def following(self) -> bool:
        """Follow the bucket, ready before this returns; whether the watch is open."""
        self.follow()
        assert self._opening is not None
        await asyncio.shield(self._opening)
        return self._following

    async def _open(self) -> None:
        try:
            await self._followers.open([self._bucket])
        except StoreError as error:
            # Without the watch this process applies nobody else's requests; its own
            # claims still work as before (announcing is an addition, not a need).
            faults.noted(_SITE, faults.STORE, "following announced ticket requests", error)
            return
        self._following = True
        self._followers.start(self._read)

    async def _read(self, watch: Watch) -> None:
        try:
            async for change in watch:
                self._take(change)
        finally:
            self._following = False  # the next claim opens it again

    def _take(self, change: Change) -> None:
        if change.value is None:
            for requests in self._pending.values():
                requests.pop(change.key, None)
            wake = self._own.get(change.key)
            if wake is not None:
                self._gone.add(change.key)
                wake.set()  # settled by a writer: its announcer looks again
            return
        if change.key in self._own:
            return  # our own: the batch that announced it decides it
        try:
            request = TicketRequest.from_json(change.value)
        except ValueError as error:
            faults.noted(_SITE, faults.UNREADABLE, f"announced ticket request {change.key}",
                         error)
            return
        self._pending.setdefault(request.provider, {})[change.key] = request

    async def aclose(self) -> None:
        """Stop following; pending deletions of keys finish first."""
        if self._deletes:
            await asyncio.gather(*self._deletes, return_exceptions=True)
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        await self._followers.close()

    # -- what writers apply ------------------------------------------------------------

    def pending(self, provider: str) -> list[TicketRequest]:
        """Other processes' live requests on ``provider``, oldest announcement first."""
        requests = self._pending.get(provider)
        if not requests:
            return []
        now = self._clock.now()
        lapsed = [key for key, r in requests.items() if r.expires_at <= now]
        for key in lapsed:
            del requests[key]  # its announcer deletes the key (or the bucket's age does)
        return list(requests.values())

    def settle(self, applied: list[TicketRequest], found: list[TicketRequest]) -> None:
        """Delete the keys of the requests a successful write ``applied`` (that wakes
        their announcers); forget those ``found`` applied by someone else, whose writer
        deletes them (a delete by every process that noticed would be read by all)."""
        for request in applied:
            key = request_key(request.provider, request.kind, request.ticket_id)
            self._pending.get(request.provider, {}).pop(key, None)
            self._delete(key)
        for request in found:
            key = request_key(request.provider, request.kind, request.ticket_id)
            self._pending.get(request.provider, {}).pop(key, None)

    # -- our own announcements ---------------------------------------------------------

    async def announce(self, provider: str, kind: RequestKind, ticket_id: str,
                       ticket: Ticket | None, wake: asyncio.Event) -> tuple[str, float] | None:
        """Announce a request; (its key, when it lapses), or None when the store refused.

        ``wake`` is set when a writer settles it.
        """
        expires_at = self._clock.now() + self.seconds
        request = TicketRequest(provider=provider, kind=kind, ticket_id=ticket_id,
                                ticket=ticket, expires_at=expires_at)
        key = request_key(provider, kind, ticket_id)
        self._own[key] = wake
        try:
            # No per-key TTL: the bucket's max age removes a key its announcer never
            # deleted, and nobody applies it after expiresAt in any case.
            await self._bucket.create(key, request.to_json())
        except StoreError as error:
            del self._own[key]
            # Not announced: the claim goes on racing as it would have without the line.
            log.debug("announcing %s failed: %s", key, error)
            return None
        return key, expires_at

    def withdraw(self, key: str) -> None:
        """Our request is decided: forget it, and delete its key unless a writer did."""
        self._own.pop(key, None)
        if key in self._gone:
            self._gone.discard(key)
            return
        self._delete(key)

    def _delete(self, key: str) -> None:
        task = asyncio.get_running_loop().create_task(self._delete_now(key))
        self._deletes.add(task)
        task.add_done_callback(self._deletes.discard)

    async def _delete_now(self, key: str) -> None:
        try:
            await self._bucket.delete(key)
        except StoreError as error:  # it lapses anyway, and writers ignore it by then
            faults.noted(_SITE, faults.CLEANUP, f"deleting announced request {key}", error)
