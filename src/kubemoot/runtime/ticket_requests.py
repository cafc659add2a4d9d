"""The entrance to a provider's claim line: requests announced beside the ticket document.

A claimer that loses a compare-and-set race on a provider's ticket document has written
nothing, so no other process can know that it waits, and with one claimer per process
(every agent pod is one) the fastest process wins again and again. Writing its place
into the document would need the very race it lost. So a loser *announces* what its
write carried instead: it creates a key of its own in ``kubemoot_ticket_requests``
(``<provider>.<announcementId>``), which no other writer contends for, and the bucket's
revisions order the announcements first come first. Every process that writes ticket
documents follows the bucket and, in its next write of that provider's document,
applies every request announced there, oldest first
(:func:`~kubemoot.runtime.ticket_decision.decide`). One write then serves claimers in
many processes, and a claimer that keeps losing is served by whoever wins.

The announcer keeps trying on its own as well, and between tries it waits on the
ticket document's own watch (:mod:`kubemoot.runtime.ticket_documents`): the revision
that carries its ticket answers it. Nobody deletes the key (a deletion is one more
delivery to every process): a writer that finds an announcement settled in the
document (granted, or marked ``served``) writes nothing for it and forgets it, a
request is never applied after its ``expiresAt``, and the bucket's max age removes the
key. Writers of earlier versions deleted the keys they settled; such a deletion still
wakes the announcer. This module keeps the followed requests and the
keys; the decision is :mod:`kubemoot.runtime.ticket_decision`'s, the retries are
:mod:`kubemoot.runtime.tickets`'.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from dataclasses import dataclass, field

from kubemoot.clock import Clock
from kubemoot.runtime import faults
from kubemoot.runtime.watching import Followers
from kubemoot.store.documents import AnnouncedRequests, RequestKind, TicketRequest
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, Change, StoreError, Watch

__all__ = ["Announcements"]

log = logging.getLogger(__name__)

_SITE = "ticket-requests"


@dataclass
class _Own:
    """One of our announcements: what wakes its waiter, and which of its requests
    still wait for an answer."""

    wake: asyncio.Event
    waiting: set[str] = field(default_factory=set)  # ticket ids
    gone: bool = False  # a writer deleted the key (settled all of it)
    revision: int = 0  # its place in the bucket's order (0: not created yet)


class Announcements:
    """This process's view of the announced requests, and its own announcements."""

    def __init__(self, bucket: Bucket, *, clock: Clock, seconds: float,
                 rng: random.Random) -> None:
        self._bucket = bucket
        self._clock = clock
        self._rng = rng
        self.seconds = seconds  # how long an announcement may be applied
        # provider → key → its requests not yet known settled, in announcement order
        self._pending: dict[str, dict[str, list[TicketRequest]]] = {}
        self._own: dict[str, _Own] = {}
        self._revisions: dict[str, int] = {}  # key → revision, of others' announcements
        #: Requests known settled (by identity), until when another copy of one is moot.
        #: The same operation can be announced twice: a combiner announces what it took
        #: from a process and could not write, and that process, handed the operation
        #: back, announces it again (the claim line test saw the second copy arrive after
        #: this process's write had served the first, and kept it pending for a minute).
        self._settled: dict[tuple[str, RequestKind, str], float] = {}
        self._followers = Followers(_SITE, "ticket-request")
        self._opening: asyncio.Task[None] | None = None
        self._following = False

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
            self._following = False  # the next operation opens it again

    def _take(self, change: Change) -> None:
        if change.value is None:
            for requests in self._pending.values():
                requests.pop(change.key, None)
            self._revisions.pop(change.key, None)
            own = self._own.get(change.key)
            if own is not None:
                own.gone = True
                own.wake.set()  # settled by a writer: its announcer looks again
            return
        if change.key in self._own:
            return  # our own: the batch that announced it decides it
        try:
            announced = AnnouncedRequests.from_json(change.value)
        except ValueError as error:
            faults.noted(_SITE, faults.UNREADABLE, f"announced ticket requests {change.key}",
                         error)
            return
        unsettled = list(announced.requests)
        if self._settled:
            unsettled = [r for r in unsettled if r.identity not in self._settled]
            if not unsettled:
                return  # copies of requests settled already: nothing to apply
        self._pending.setdefault(announced.provider, {})[change.key] = unsettled
        self._revisions[change.key] = change.revision

    async def aclose(self) -> None:
        """Stop following."""
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        await self._followers.close()

    # -- what writers apply ------------------------------------------------------------

    def pending(self, provider: str) -> list[TicketRequest]:
        """Other processes' live requests on ``provider``, oldest announcement first."""
        keys = self._pending.get(provider)
        if not keys:
            return []
        now = self._clock.now()
        live: list[TicketRequest] = []
        for key in list(keys):
            requests = [r for r in keys[key] if r.expires_at > now]
            if requests:
                keys[key] = requests
                live.extend(requests)
            else:
                del keys[key]  # lapsed: its announcer deletes the key (or the bucket's age)
                self._revisions.pop(key, None)
        return live

    def settle(self, applied: list[TicketRequest], found: list[TicketRequest]) -> None:
        """Forget the requests a successful write ``applied`` and those it ``found``
        applied by someone else. The keys are their announcers' to delete: an announcer
        learns from the ticket document's watch that it was served, and a delete here
        would cost a round trip and a delivery to every process for nothing."""
        if not applied and not found:
            return  # most writes: nothing announced was settled
        known = {r.identity for r in (*applied, *found)}
        if known:
            now = self._clock.now()
            settled = self._settled
            for identity in [i for i, until in settled.items() if until <= now]:
                del settled[identity]
            moot = now + self.seconds  # any copy announced so far has lapsed by then
            for identity in known:
                settled[identity] = moot
        for provider in {r.provider for r in (*applied, *found)}:
            keys = self._pending.get(provider, {})
            for key in list(keys):
                left = [r for r in keys[key] if r.identity not in known]
                if left:
                    keys[key] = left
                else:
                    del keys[key]
                    self._revisions.pop(key, None)

    def behind(self, provider: str, key: str, document: bytes | None) -> bool:
        """Whether another process announced a request on ``provider`` before our
        announcement ``key`` that ``document`` (the newest ticket document delivered, as
        bytes) has not settled yet: a claim whose ticket is not in it, or a release whose
        ticket still is. Its announcer is ahead in the line, and the write that serves it
        serves ours too."""
        own = self._own.get(key)
        keys = self._pending.get(provider)
        if own is None or not own.revision or not keys or document is None:
            return False
        now = self._clock.now()
        for other, requests in keys.items():
            revision = self._revisions.get(other)
            if revision is None or revision >= own.revision:
                continue
            for request in requests:
                if request.expires_at <= now:
                    continue
                present = request.ticket_id.encode() in document
                if present is (request.kind is RequestKind.RELEASE):
                    return True
        return False

    def gone(self, key: str) -> bool:
        """Whether a writer deleted our announcement ``key`` (a writer of an earlier
        version does so once it settled all of it)."""
        own = self._own.get(key)
        return own is not None and own.gone

    # -- our own announcements ---------------------------------------------------------

    async def announce(self, provider: str, requests: list[TicketRequest],
                       wake: asyncio.Event) -> str | None:
        """Announce ``requests`` under one key; the key, or None when the store refused.

        ``wake`` is set when a writer settles the last of them.
        """
        token = uuid.UUID(int=self._rng.getrandbits(128), version=4)
        key = f"{encode_token(provider)}.{encode_token(str(token))}"
        self._own[key] = _Own(wake, {r.ticket_id for r in requests})
        announced = AnnouncedRequests(provider=provider, requests=requests)
        try:
            # No per-key TTL: the bucket's max age removes a key its announcer never
            # deleted, and nobody applies a request after its expiresAt in any case.
            revision = await self._bucket.create(key, announced.to_json())
        except StoreError as error:
            del self._own[key]
            # Not announced: the operations go on racing as they would without the line.
            log.debug("announcing %s failed: %s", key, error)
            return None
        own = self._own.get(key)
        if own is not None:
            own.revision = revision
        return key

    def request(self, provider: str, ticket_id: str, **fields: object) -> TicketRequest:
        """One request to announce, lapsing ``seconds`` from now."""
        return TicketRequest(provider=provider, ticket_id=ticket_id,
                             expires_at=self._clock.now() + self.seconds,
                             **fields)  # type: ignore[arg-type]

    def answered(self, key: str, ticket_id: str) -> None:
        """One of our announced requests has its answer; the last one ends the
        announcement here. Its key is not deleted: a deletion would be delivered to
        every process that follows the bucket, and nobody applies a request after its
        ``expiresAt`` anyway. The bucket's max age removes the key."""
        own = self._own.get(key)
        if own is None:
            return
        own.waiting.discard(ticket_id)
        if not own.waiting:
            del self._own[key]
