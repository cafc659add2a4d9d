"""Waiting for GPU capacity on state changes instead of polling.

:class:`CapacityWatch` watches the provider-state and ticket buckets. Every probe
publish, claim and release advances a change counter; a waiter records the counter,
places again against fresh state, and blocks in :meth:`CapacityWatch.changed_since`
until the counter moves. A ticket that lapses (its holder died) changes no key, so the
watch also advances the counter when the earliest known ticket expiry passes: waiters
see memory returned by the TTL layer without a probe having to run.

When the watch cannot be established, :meth:`CapacityWatch.start` raises
:class:`WatchUnavailable` at once, and a waiter whose watch ended gets it too: a caller
stands aside instead of waiting without a wake source.
"""

from __future__ import annotations

import asyncio
import logging

from kubemoot.clock import Clock
from kubemoot.runtime import faults
from kubemoot.runtime.watching import Followers, ParsedDocuments
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.protocol import Bucket, Change, StoreError, Watch

__all__ = ["CapacityWatch", "WatchUnavailable"]

log = logging.getLogger(__name__)


class WatchUnavailable(Exception):
    """There is no wake source: the watch could not be set up, or it ended."""


class CapacityWatch:
    """A change counter over the provider-state and ticket buckets."""

    def __init__(
        self, states: Bucket, tickets: Bucket, *, clock: Clock,
        documents: ParsedDocuments[ProviderTickets] | None = None,
    ) -> None:
        self._buckets = (states, tickets)
        #: The ticket documents, parsed once per revision (shared with the provider view).
        self._documents = documents or ParsedDocuments(ProviderTickets.from_json)
        self._tickets_bucket = tickets.name
        self._clock = clock
        self._counter = 0
        #: Set on the next change; made only when a waiter needs one (most changes — every
        #: ticket write of every call — find nobody waiting).
        self._changed: asyncio.Event | None = None
        self._followers = Followers("capacity-watch", "capacity")
        self._expiries: dict[str, list[float]] = {}  # ticket key → live tickets' expiries
        self._started = False
        self._ended: str | None = None

    @property
    def started(self) -> bool:
        """Whether :meth:`start` established the watches (a wake source exists)."""
        return self._started

    @property
    def counter(self) -> int:
        """How many changes have been seen so far."""
        return self._counter

    async def start(self) -> None:
        """Establish both watches now; raises :class:`WatchUnavailable` when it cannot."""
        if self._started:
            return
        try:
            await self._followers.open(self._buckets)
            await self._seed_expiries()
        except StoreError as error:
            await self.close()
            raise WatchUnavailable(f"cannot watch capacity: {error}") from error
        self._started = True
        self._followers.start(self._follow)

    async def _seed_expiries(self) -> None:
        tickets = self._buckets[1]
        for key in await tickets.keys():
            entry = await tickets.get(key)
            if entry is not None:
                self._note_tickets(key, entry.revision, entry.value)

    def _note_tickets(self, key: str, revision: int, value: bytes | None) -> None:
        now = self._clock.now()
        if value is None:
            self._expiries.pop(key, None)
            return
        try:
            document = self._documents.of(key, revision, value)
        except ValueError as error:
            # Its expiries stay as last known: an unreadable document frees nothing. The
            # provider view reports (logs and counts) the same document once; not again.
            log.debug("capacity watch cannot read the ticket document %s: %s", key, error)
            return
        live = [t.expires_at for t in document.tickets if t.expires_at > now]
        if live:
            self._expiries[key] = live
        else:
            self._expiries.pop(key, None)

    async def _follow(self, watch: Watch) -> None:
        try:
            async for change in watch:
                self._on_change(change)
        except StoreError as error:
            faults.noted("capacity-watch", faults.STORE, "capacity watch failed", error)
        finally:
            if self._ended is None:
                self._ended = "the capacity watch ended"
            self._wake()

    def _on_change(self, change: Change) -> None:
        if change.bucket == self._tickets_bucket:
            self._note_tickets(change.key, change.revision, change.value)
        self.notify()

    def notify(self) -> None:
        """Advance the counter locally (e.g. the discussion ended): wakes every waiter."""
        self._counter += 1
        changed, self._changed = self._changed, None  # _wake, inline: every change passes
        if changed is not None:
            changed.set()

    def _wake(self) -> None:
        """Wake whoever waits now; the next waiter gets a fresh event."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _drop_expiries(self, *, at: float) -> None:
        live = {k: [t for t in v if t > at] for k, v in self._expiries.items()}
        self._expiries = {k: v for k, v in live.items() if v}

    def _next_expiry(self) -> float | None:
        return min((min(v) for v in self._expiries.values()), default=None)

    async def changed_since(self, counter: int, timeout: float | None) -> int:
        """Wait until the counter moves past ``counter``; returns the new counter.

        Returns at once when it already moved. Raises ``TimeoutError`` after
        ``timeout`` seconds of the clock, :class:`WatchUnavailable` when the watch ended.
        """
        deadline = None if timeout is None else self._clock.now() + timeout
        while True:
            if self._counter != counter:
                return self._counter
            if self._ended is not None:
                raise WatchUnavailable(self._ended)
            now = self._clock.now()
            expiry = self._next_expiry()
            if expiry is not None and expiry <= now:
                # A ticket lapsed: its memory is back though no key changed.
                self._drop_expiries(at=now)
                self.notify()
                continue
            until_deadline = None if deadline is None else max(0.0, deadline - now)
            until_expiry = None if expiry is None else max(0.0, expiry - now)
            expiry_first = until_expiry is not None and (
                until_deadline is None or until_expiry < until_deadline
            )
            wait = until_expiry if expiry_first else until_deadline
            try:
                changed = self._changed
                if changed is None:
                    changed = self._changed = asyncio.Event()
                await self._clock.wait_for(changed.wait(), wait)
            except TimeoutError:
                if self._counter != counter:
                    return self._counter
                if not expiry_first:
                    raise
                # The clock reached the earliest expiry (virtual clocks may not show it
                # in now() yet): that ticket's memory is back.
                self._drop_expiries(at=max(self._clock.now(), expiry or 0.0))
                self.notify()

    async def close(self) -> None:
        """Stop watching; waiters get :class:`WatchUnavailable`."""
        self._ended = self._ended or "the capacity watch was closed"
        await self._followers.close()
        self._wake()
