"""VRAM tickets: claim by compare-and-set, release in a ``finally``, reclaim by TTL.

All tickets of one provider live in one document (``kubemoot_provider_tickets/<provider>``)
so one compare-and-set covers the provider's whole budget. A claim reads the ticket
document and the provider state, decides with the budget of :mod:`kubemoot.runtime.budget`,
and writes with the revision it read; a lost race re-reads and decides again.

Round trips. The compare-and-set guards only the ticket document, so the claim need not
read it when this manager holds the copy it last wrote: the write itself tells whether
that copy was current (a :class:`~kubemoot.store.protocol.RevisionMismatch` sends the
claim back to read and decide again). A caller that already holds the provider state
(the runtime's provider view, cached or followed by a watch) passes it as
``provider_state`` and the claim skips reading it; should the claim be refused on that
state, or lose a race, it is decided again on a freshly read state before any answer is
given. An uncontended claim is then one write, and so is its release.

Fairness and speed. A plain CAS loop lets some claimers lose again and again while
every loser's write costs the server work. Here every operation of one
:class:`TicketManager` on one provider (claims, releases, renewals, state changes) goes
into a queue, and one task per provider turns *everything queued* into a single
compare-and-set: each request is decided in arrival order against the budget left by the
ones before it. A process therefore sends one write where it would have sent many, its
claimers are served first come first served, and across processes a lost race backs off
with jitter (through the injected clock) before deciding again. Every decision is still
made against the document at the revision the write is conditional on, so the budget
invariant is exactly as strong as with one claim per write.

The line across processes. A lost race leaves no trace in the document, so an
operation that lost one is *announced* beside it
(:mod:`kubemoot.runtime.ticket_requests`, when the manager is given the requests
bucket), and every write of the document applies the announcements it knows of, oldest
first, before its own operations. The announcer keeps trying meanwhile, waits between
tries on its announcement being settled, and does not give up for lost races while the
announcement is live. A claim's condition (:class:`~kubemoot.store.documents.ClaimCondition`)
is data and travels with the announcement, so any writer judges it; a claim with a
check in code is never announced (no other process can run the check).

Two release layers, both always present: :meth:`TicketManager.release` removes the
ticket at once (use it in a ``finally``, or use :meth:`TicketManager.claimed`), and every
ticket carries ``expiresAt``: readers ignore expired tickets and writers prune them, so a
holder that died returns its memory after the TTL without any reaper. Some releases
have no caller waiting on them (a claim granted after its caller was cancelled, the
withdrawal of an announced claim its caller heard "no" to, and a finished call's
release on NATS, which its caller does not wait for: :meth:`TicketManager.release_sent`),
so :meth:`TicketManager.aclose` writes what is still queued before it returns.

Applying a batch is idempotent (a claim already present is granted, not added twice; a
release of an absent ticket is done), so a write whose outcome is unknown — the
connection dropped before the acknowledgement — is simply decided again.

Under contention, with a message bus, a lane hands its operations to the provider's
*combiner* instead (:mod:`kubemoot.runtime.ticket_delegation`): one process that writes
everyone's operations in arrival order and answers each sender, so nobody is woken by
the others' announcements and documents. Without a bus, or when no combiner answers,
the line above is the way in.

What a batch does to the document is decided by the pure
:func:`kubemoot.runtime.ticket_decision.decide`; this module reads, queues, writes and
retries around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypedDict, Unpack

from kubemoot import metrics
from kubemoot.clock import Clock
from kubemoot.runtime import faults
from kubemoot.runtime import ticket_delegation as delegation
from kubemoot.runtime.lease import Lease
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.runtime.ticket_decision import (
    Check,
    Decision,
    Gone,
    OpKind,
    Refused,
    TicketOp,
    decide,
)
from kubemoot.runtime.ticket_documents import Followed, TicketDocuments
from kubemoot.runtime.ticket_encoding import TicketEncoder
from kubemoot.runtime.ticket_requests import Announcements
from kubemoot.runtime.watching import ParsedDocuments
from kubemoot.settings import DEFAULTS
from kubemoot.store.bus import Bus, BusError, Message, NoResponders, Subscription
from kubemoot.store.documents import (
    AnnouncedRequests,
    ClaimCondition,
    ProviderState,
    ProviderTickets,
    RequestKind,
    Ticket,
    TicketRequest,
    TicketState,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import (
    Bucket,
    HandingBucket,
    KeyExists,
    KeyNotFound,
    RevisionMismatch,
    StoreError,
    StoreUnavailable,
)

__all__ = [
    "Check",
    "ClaimConflict",
    "ClaimOptions",
    "ClaimRejected",
    "TicketGone",
    "TicketManager",
]

log = logging.getLogger(__name__)
# Every granted claim counts here: labels() validates and takes a lock on each call, so
# the child is looked up once.
_GRANTED = metrics.CLAIMS.labels(result="granted")

# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read, a module global about 150): the ones
# compared or made once or more per operation are kept at module level.
_CLAIM, _RELEASE = OpKind.CLAIM, OpKind.RELEASE
_RENEW, _STATE, _RUNNING = OpKind.RENEW, OpKind.STATE, TicketState.RUNNING
_REQUEST_CLAIM, _REQUEST_RELEASE = RequestKind.CLAIM, RequestKind.RELEASE

#: Who hears a sent release's final outcome: None, or the error it ended in.
Settled = Callable[[BaseException | None], None]
_RELEASE_PATIENCE = 16  # a release may lose this many times more races than a claim
_CONTENDED_TURNS = 4  # a lane counts as contended for this many backoff caps after a loss
# An operation is announced for other processes to apply once it lost this many races.
# Waiting for a second loss was tried: with twenty processes the losers then spent two
# backoffs racing before anyone could serve them, and bench/kv.py's 20-process run gave
# fewer claims per second than with no announcements at all.
_ANNOUNCE_AFTER_LOSSES = 1
# How long an announced operation lets an older announcer's write go first.
_BEHIND_SECONDS = 0.05
# A combiner that loses this many races in a row stops combining (new combiners meet
# in a roll call, so this is another writer it cannot outpace). Stopping at the first
# loss made a cascade: what it handed back was written by its senders, whose writes
# beat the next combiner, which stopped too (bench/kv.py, 20 processes: 12 to 36
# combiners a run, 391 and 420 claims/s).
_COMBINER_LOSSES = 3
# How long a new combiner gathers the ranks of the others (the roll call).
_ROLL_CALL_SECONDS = 0.02
# A lane that wrote the document itself less than this ago asks for a combiner before
# its next write, unless it found none in the last _PROBE_SECONDS.
_BUSY_SECONDS = 0.05
_PROBE_SECONDS = 0.1
# A lane whose operations a combiner answered keeps sending them there this long after
# the last answer, though it loses no race of its own meanwhile (it writes nothing).
_DELEGATE_SECONDS = 1.0

class ClaimOptions(TypedDict, total=False):
    """The optional arguments of :meth:`TicketManager.claim`, for callers that pass them on."""

    state: TicketState
    evicts: Mapping[str, int] | None
    check: Check | None
    condition: ClaimCondition | None
    provider_state: ProviderState | None
    snapshot: ProviderSnapshot | None


class ClaimConflict(StoreError):
    """Every attempt lost a compare-and-set race; the caller may fall back or retry."""


class ClaimRejected(Exception):
    """The budget (or the claim's own check) says no: not a race, the memory is not there."""

    def __init__(self, provider: str, model: str, footprint_mib: int, reason: str) -> None:
        self.provider = provider
        self.model = model
        self.footprint_mib = footprint_mib
        self.reason = reason
        super().__init__(f"claim of {footprint_mib} MiB for {model} on {provider}: {reason}")


class TicketGone(KeyNotFound):
    """The ticket is no longer there (released, or expired and pruned)."""


class _Lapsed(Exception):
    """An operation taken from another process was not decided before its request
    lapsed (its sender decides it itself)."""




@dataclass(eq=False)
class _Op:
    kind: OpKind
    ticket_id: str
    future: asyncio.Future[Ticket | None]
    max_attempts: int
    ticket: Ticket | None = None  # CLAIM: the ticket to add
    check: Check | None = None
    condition: ClaimCondition | None = None
    ttl_seconds: float | None = None  # RENEW
    state: TicketState | None = None  # STATE
    known_state: ProviderState | None = None  # CLAIM: the state the caller holds
    snapshot: ProviderSnapshot | None = None  # CLAIM: the provider as the caller priced it
    reread: bool = False  # CLAIM: decide on a freshly read state and document from now on
    fresh_state: bool = False  # CLAIM: decide on a freshly read state from now on
    attempts: int = 0
    abandoned: bool = False  # the caller was cancelled while waiting
    announced: str | None = None  # the key of its announced request, while it waits
    announced_until: float | None = None  # when that announcement lapses
    withdraw_until: float | None = None  # RELEASE: withdraws an announced claim
    # Sent to a combiner once, which did not answer it: decided here from then on, as
    # an announced operation (a claim given up on is withdrawn).
    delegated: bool = False
    # Taken from another process as its combiner: never applied after this (the
    # sender's expiresAt), answered on the bus.
    foreign_until: float | None = None
    # Taken from another process: the newest revision of the document this lane knew
    # when it finished (one that shows its outcome), sent back with the answer.
    revision: int = 0

    def request(self, ttl_seconds: float) -> TicketOp:
        """The operation as :func:`decide` sees it (``ttl_seconds``: the manager's)."""
        ttl = self.ttl_seconds if self.ttl_seconds is not None else ttl_seconds
        return TicketOp(self.kind, self.ticket_id, ticket=self.ticket, check=self.check,
                        condition=self.condition, ttl_seconds=ttl, state=self.state,
                        abandoned=self.abandoned,
                        announced_until=(self.announced_until
                                         if self.kind is _CLAIM else None),
                        withdraw_until=self.withdraw_until, snapshot=self.snapshot)

    @property
    def delegable(self) -> bool:
        """Whether a combiner could decide it: what could be announced, not sent to
        one before, and not taken from another process."""
        return (not self.delegated and self.foreign_until is None
                and self.announced is None and self.announceable)

    @property
    def announceable(self) -> bool:
        """Whether another process could apply it: a claim without a check in code (its
        condition is data and travels along), or a plain release; each is announced
        once."""
        if self.announced is not None or (self.announced_until is not None
                                          and self.foreign_until is None
                                          and not self.delegated):
            # Announced once. A claim taken from another process, or one handed back by
            # a combiner, carries its announcement's end but is not announced yet.
            return False
        if self.withdraw_until is not None:
            return False  # it must mark the claim served, which an announcement cannot
        if self.kind is _CLAIM:
            return self.check is None and not self.abandoned
        return self.kind is _RELEASE


@dataclass(eq=False)
class _Lane:
    """The queue of one provider's pending operations, and the task serving it."""

    provider: str
    pending: list[_Op] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    # Set when a writer settled one of this lane's announced requests, or when the
    # followed document changed (either may answer an announced operation).
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # The document as this lane last wrote it (or read it and left it): the next batch
    # tries its CAS on it without reading first; a lost race drops it.
    cached: tuple[ProviderTickets, int] | None = None
    # The newest revision of the document this lane has read, written or been
    # delivered: a document at it is as fresh as this process knows.
    seen: int = 0
    # The document as the watch delivers it, once this lane lost a race.
    followed: Followed | None = None
    # The provider's state as its watch delivers it, from the same moment on.
    state: Followed | None = None
    # The revision this lane last lost a race on: the next try waits briefly for the
    # watch to deliver the one that beat it instead of reading.
    lost_on: int | None = None
    # When this lane last lost a race (on the injected clock); None: never.
    lost_at: float | None = None
    # Listening as the provider's combiner (:mod:`kubemoot.runtime.ticket_delegation`).
    combining: Subscription | None = None
    # When a combiner last answered this lane's operations; None: never.
    delegated_at: float | None = None
    # When an operation last came to this lane or left it (a combiner's idleness).
    active_at: float = 0.0
    resigning: asyncio.Task[None] | None = None
    joining: bool = False  # subscribing as the combiner right now
    roll: list[Subscription] = field(default_factory=list)  # the roll call's
    rank: int = 0  # while combining: the lowest rank stays when combiners meet
    combiner_losses: int = 0  # races lost in a row while combining
    wrote_at: float | None = None  # when this lane last wrote the document itself
    probed_at: float | None = None  # when it last asked for a combiner and found none
    # Encodes the documents this lane writes, each ticket once (made at the first write).
    encoder: TicketEncoder | None = None
    # A write sent without the lane's task is waiting for its acknowledgement
    # (TicketManager._write_at_once): the lane is busy as with a task.
    writing: bool = False
    # Made by _drain while such a write waits; done when its acknowledgement is heard.
    written: asyncio.Future[None] | None = None


class TicketManager:
    """Claims, renews and releases VRAM tickets on providers' ticket documents."""

    def __init__(
        self,
        tickets: Bucket,
        states: Bucket,
        *,
        clock: Clock,
        ttl_seconds: float = DEFAULTS.ticket_ttl_seconds,
        max_attempts: int = DEFAULTS.claim_attempts,
        rng: random.Random | None = None,
        backoff_base_seconds: float = 0.001,
        backoff_cap_seconds: float = 0.05,
        line_seconds: float = DEFAULTS.claim_line_seconds,
        requests: Bucket | None = None,
        request_seconds: float = DEFAULTS.claim_request_seconds,
        bus: Bus | None = None,
        combine_idle_seconds: float = 1.0,
        parsed: ParsedDocuments[ProviderTickets] | None = None,
    ) -> None:
        self._tickets = tickets
        # A store whose answers come at the network's moment anyway (NATS) writes an
        # idle lane's operation in its caller's turn and hands the acknowledgement
        # over as it is read (_write_at_once); the embedded store does not, so the
        # simulator's loop turns, which its decisions follow, stay those of the task.
        self._update_then = (tickets.update_then if isinstance(tickets, HandingBucket)
                             else None)
        # The process's ticket documents parsed once per revision (shared with its
        # provider view and capacity watch): each document this manager writes goes in
        # as written, so its readers here need not parse it back from the bytes.
        self._parsed = parsed
        self.line_seconds = line_seconds
        self._states = states
        self._clock = clock
        self.ttl_seconds = ttl_seconds
        self.max_attempts = max_attempts
        self._rng = rng if rng is not None else random.Random()
        # Where claims that lost a race are announced for other writers to apply
        # (:mod:`kubemoot.runtime.ticket_requests`); None: every claim races on its own.
        self._announcements = (
            None if requests is None
            else Announcements(requests, clock=clock, seconds=request_seconds, rng=self._rng)
        )
        self._backoff_base = backoff_base_seconds
        self._backoff_cap = backoff_cap_seconds
        self._lanes: dict[str, _Lane] = {}
        # Followed after a lost race, and only with the line (the watch is what tells
        # an announcer it was served).
        self._documents = None if requests is None else TicketDocuments(tickets)
        # The provider states of those lanes, followed alike: their tries after a lost
        # race decide on the delivered state instead of reading it.
        self._followed_states = (None if requests is None
                                 else TicketDocuments(states, "provider states"))
        # Under contention operations go to the provider's combiner on this bus
        # (:mod:`kubemoot.runtime.ticket_delegation`); only with the line, whose
        # request time bounds how long a combiner may apply them.
        self._bus = bus if requests is not None else None
        self._request_seconds = request_seconds
        self.combine_idle_seconds = combine_idle_seconds
        self._replying: set[asyncio.Task[None]] = set()
        self._combined = 0  # operations sent to a combiner, or taken as one
        self._closing = False  # aclose() is writing what is still queued
        # Releases the store refused (an outage), tried again in the background until
        # it answers or the ticket's TTL has reclaimed it (_retry_later):
        # (provider, ticket) → when the TTL ends, who hears the outcome (a sent
        # release's receiver; None where the caller heard the error), the last error.
        self._unreleased: dict[tuple[str, str], tuple[float, Settled | None,
                                                      BaseException | None]] = {}
        self._retrying: asyncio.Task[None] | None = None
        self._retry_pause = 0.5

    @property
    def combines(self) -> bool:
        """Whether contended operations go to a provider's combiner: a bus was given
        and the claim line is on (without either they race, and are announced)."""
        return self._bus is not None

    @property
    def combined(self) -> int:
        """How many operations this manager sent to a provider's combiner or took
        from other processes as one, since it was made (counted only under
        contention: an uncontended claim never touches it)."""
        return self._combined

    async def open(self) -> bool:
        """Follow the requests other processes announce now, rather than from the first
        operation on; whether they are followed (False without a requests bucket, or
        when the store refused the watch: this process then applies nobody's)."""
        return self._announcements is not None and await self._announcements.following()

    def announced(self, provider: str) -> list[TicketRequest]:
        """Other processes' live announced requests on ``provider`` that this process
        would apply in its next write there, oldest first."""
        return [] if self._announcements is None else self._announcements.pending(provider)

    async def aclose(self) -> None:
        """Write what is still queued, then stop following announced requests and
        ticket documents (if it did), and combining for any provider."""
        if self._retrying is not None:  # the store closes next: the TTL takes those
            self._retrying.cancel()
        for lane in self._lanes.values():
            await self._resign(lane)
            if lane.resigning is not None:
                lane.resigning.cancel()
        await self._drain()
        if self._announcements is not None:
            await self._announcements.aclose()
        if self._documents is not None:
            await self._documents.aclose()
        if self._followed_states is not None:
            await self._followed_states.aclose()

    async def _drain(self) -> None:
        """Wait until no lane has operations queued.

        Some queued operations have no caller waiting on them: the withdrawal of an
        announced claim its caller heard "no" to (another process may have granted the
        announcement meanwhile, and only the withdrawal removes that ticket) and the
        release of a claim granted after its caller was cancelled. Their caller's call
        has returned, so a process that closes right after would leave such a ticket
        holding memory until its TTL (the racing claimers with the claim line in
        tests/store/test_tickets.py now and then found one left after closing). Every
        queued operation ends after its bounded attempts, so this wait ends too.

        Closing, each gets at most ``max_attempts`` more tries (a claim's, not a
        release's patience): a process whose writes keep losing (tests/store/
        test_claim_line.py has one) would otherwise hold up its close for hundreds of
        backoffs, and past them the TTL reclaims the memory as it would have.
        """
        self._closing = True
        for lane in self._lanes.values():
            for op in lane.pending:
                op.max_attempts = min(op.max_attempts, op.attempts + self.max_attempts)
        await self.quiet()

    async def quiet(self) -> None:
        """Wait until no lane has a write in flight or a task serving it: what a
        release sent by :meth:`release_sent` leaves behind is then settled.

        One lane at a time, on a future of the waiter's own (a waiter cancelled here
        cancels only that; asyncio.wait would cost some thirty calls a wait)."""
        while True:
            busy: asyncio.Future[Any] | None = None
            for lane in self._lanes.values():
                if lane.writing:
                    busy = self._written(lane)
                    break
                task = lane.task
                if task is not None and not task.done():
                    busy = task
                    break
            if busy is None:
                return
            ended: asyncio.Future[None] = busy.get_loop().create_future()
            busy.add_done_callback(partial(_end, ended))
            await ended

    @staticmethod
    def _written(lane: _Lane) -> asyncio.Future[None]:
        """Done once the write the lane sent without its task is heard (the lane's task
        may take its operations on from there)."""
        if lane.written is None:
            lane.written = asyncio.get_running_loop().create_future()
        return lane.written

    # -- reading ---------------------------------------------------------------------

    async def read(self, provider: str) -> tuple[ProviderTickets, int | None]:
        """The ticket document (expired tickets included) and its revision (None: absent)."""
        entry = await self._tickets.get(encode_token(provider))
        if entry is None:
            return ProviderTickets(provider=provider), None
        return ProviderTickets.from_json(entry.value), entry.revision

    async def active(self, provider: str) -> list[Ticket]:
        """The provider's tickets that have not expired."""
        document, _revision = await self.read(provider)
        return document.active(self._clock.now())

    async def _state(self, provider: str) -> ProviderState | None:
        key = encode_token(provider)
        followed = self._followed_states
        # A watch set up before this read delivers every later change: the revision
        # read stays the lane's delivered state until then (the watch delivers only
        # changes, and a card's state rarely changes while claims race on it).
        noting = followed is not None and followed.ready
        entry = await self._states.get(key)
        if entry is None:
            return None
        state = ProviderState.from_json(entry.value)
        if noting and followed is not None:
            followed.noted(key, entry.value, entry.revision, parsed=state)
        return state

    def _delivered_state(self, lane: _Lane) -> ProviderState | None:
        """The lane's provider state as its watch last delivered it; None when it is not
        followed or nothing was delivered yet (then the state is read)."""
        followed = lane.state
        if (followed is None or self._followed_states is None
                or not self._followed_states.following or followed.value is None):
            return None
        parsed = followed.parsed
        if parsed is not None and parsed[0] == followed.revision:
            assert isinstance(parsed[1], ProviderState)
            return parsed[1]
        state = ProviderState.from_json(followed.value)
        followed.parsed = (followed.revision, state)
        return state

    @property
    def _release_attempts(self) -> int:
        # Releases retry far longer than claims: a release that gives up leaves its
        # memory spent until the TTL, while a conflict only means others progressed.
        return self.max_attempts * _RELEASE_PATIENCE

    # -- operations ------------------------------------------------------------------

    def _new_ticket_id(self) -> str:
        # From the injected generator, so a seeded simulation is reproducible.
        return ticket_id_of(self._rng.getrandbits(128))

    async def claim(
        self,
        provider: str,
        model: str,
        footprint_mib: int,
        holder_id: str,
        *,
        state: TicketState = TicketState.RUNNING,
        evicts: Mapping[str, int] | None = None,
        check: Check | None = None,
        condition: ClaimCondition | None = None,
        provider_state: ProviderState | None = None,
        snapshot: ProviderSnapshot | None = None,
    ) -> Ticket:
        """Claim ``footprint_mib`` of the provider's VRAM for ``model``.

        ``condition`` is what must hold besides the memory, as data: it is judged in
        whichever process's write grants the claim, so the claim may be announced.
        ``check`` is the same in code, judged only here (such a claim is never announced).

        ``provider_state`` is the provider's state as the caller last saw it; with it the
        claim is decided without reading the state first, and only a refusal or a lost
        race costs a fresh read (the answer always rests on a read state then).
        ``snapshot`` is the provider as the caller priced the claim (its state being
        ``provider_state``): the claim is judged on it when the documents decided on
        are the ones it was made of, which spares working its figures out again.

        Raises :class:`ClaimRejected` when the budget (or the condition, or ``check``)
        says no, :class:`ClaimConflict` when every attempt lost a race, and
        :class:`~kubemoot.store.protocol.StoreUnavailable` when the store is unreachable.
        """
        now = self._clock.now()
        ticket = Ticket(
            ticket_id=self._new_ticket_id(),
            model=model,
            model_footprint_mib=footprint_mib if footprint_mib > 0 else 0,  # max(0, ...)
            holder_id=holder_id,
            state=state,
            started_at=now,
            expires_at=now + self.ttl_seconds,
            evicts=dict(evicts or {}),
        )
        op = self._op(
            _CLAIM, ticket.ticket_id, ticket=ticket, check=check,
            condition=condition, known_state=provider_state, snapshot=snapshot,
        )
        try:
            granted = await self._submit(provider, op)
        except ClaimRejected:
            metrics.CLAIMS.labels(result="rejected").inc()
            raise
        except ClaimConflict:
            metrics.CLAIMS.labels(result="conflict").inc()
            raise
        assert granted is not None
        _GRANTED.inc()
        return granted

    async def release(self, provider: str, ticket_id: str) -> None:
        """Remove the ticket now; releasing an absent ticket is a no-op.

        A release the store refused (an outage) raises, and is tried again in the
        background until the store answers or the TTL has reclaimed the ticket: the TTL
        alone would keep the slot and memory counted on the card for minutes after a
        short outage, while this process is alive and knows the ticket is done. Every
        caller gets that — a call, a plan held from selection, a pinned load.
        """
        op = self._op(_RELEASE, ticket_id, max_attempts=self._release_attempts)
        try:
            await self._submit(provider, op)  # not through _release_once: a call less
        except (StoreError, OSError):
            self._retry_later(provider, ticket_id)
            raise

    async def _release_once(self, provider: str, ticket_id: str) -> None:
        op = self._op(_RELEASE, ticket_id, max_attempts=self._release_attempts)
        await self._submit(provider, op)

    def _retry_later(self, provider: str, ticket_id: str, settled: Settled | None = None,
                     until: float | None = None, error: BaseException | None = None) -> None:
        """Try a release the store refused again in the background, every 0.5 s doubling
        to 5 s, until it lands or ``until`` (the ticket's TTL from now, by default):
        the TTL alone would keep the slot and memory counted on the card for minutes
        after a short outage. ``settled`` hears the final outcome (a sent release's
        receiver, :meth:`release_sent`)."""
        ends = self._clock.now() + self.ttl_seconds if until is None else until
        self._unreleased[(provider, ticket_id)] = (ends, settled, error)
        self._retry_pause = 0.5  # a newly refused release is tried again soon
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.get_running_loop().create_task(self._retry_releases())

    async def _retry_releases(self) -> None:
        while self._unreleased:
            pause = self._retry_pause
            self._retry_pause = min(pause * 2, 5.0)
            await self._clock.sleep(pause)
            for key, (ends, settled, error) in list(self._unreleased.items()):
                provider, ticket_id = key
                outcome: BaseException | None = error
                if self._clock.now() < ends:  # else the TTL has reclaimed it by now
                    try:
                        await self._release_once(provider, ticket_id)  # idempotent
                    except (StoreError, OSError) as again:
                        self._unreleased[key] = (ends, settled, again)
                        continue  # the store is still away: next turn
                    outcome = None
                    log.info("released ticket %s on %s once the store answered again",
                             ticket_id, provider)
                del self._unreleased[key]
                if settled is not None:
                    self._tell(provider, ticket_id, settled, outcome)

    def release_sent(self, provider: str, ticket_id: str,
                     settled: Settled) -> bool:
        """:meth:`release` that returns once the write is sent: True when it went out in
        this turn (or needed none), its outcome then handed to ``settled`` (None, or
        the error :meth:`release` would have raised); False, with nothing done, when
        it cannot go out at once (the store does not hand acknowledgements over, the
        lane is busy or in any but its plainest state): await :meth:`release` then.

        A finished call's release has nothing left to wait for: its caller's answer
        does not depend on the acknowledgement, this process's next operation on the
        provider queues behind the write in the lane (and is decided on the document
        it writes), and other processes see the release when the store has it,
        whether anyone here waits or not. Waiting cost every call a round trip to
        the store. A lost race is decided again in the lane's task as for any
        operation; a release the store refused is tried again until the TTL would
        have reclaimed the ticket (:meth:`_retry_later`), and only its final
        outcome reaches ``settled``.
        """
        if self._update_then is None:
            return False
        lane = self._lanes.get(provider)
        if (lane is None or lane.writing or lane.pending
                or (lane.task is not None and not lane.task.done())):
            return False
        if self._announcements is not None:
            self._announcements.follow()
        op = self._op(_RELEASE, ticket_id, max_attempts=self._release_attempts)
        lane.pending.append(op)
        if not self._write_at_once(provider, lane, op):
            lane.pending.remove(op)
            return False
        lane.active_at = self._clock.now()
        until = self._clock.now() + self.ttl_seconds  # its ticket expires by then
        op.future.add_done_callback(
            lambda done: self._sent_settled(provider, ticket_id, settled, until, done))
        return True

    def _sent_settled(self, provider: str, ticket_id: str,
                      settled: Settled, until: float,
                      done: asyncio.Future[Ticket | None]) -> None:
        """The outcome of a release sent by :meth:`release_sent`, in a loop callback."""
        error = (asyncio.CancelledError() if done.cancelled()
                 else done.exception())  # retrieved: nobody else reads it
        if (isinstance(error, StoreUnavailable) and not self._closing
                and self._clock.now() < until):
            self._retry_later(provider, ticket_id, settled, until, error)
            return
        self._tell(provider, ticket_id, settled, error)

    def _tell(self, provider: str, ticket_id: str,
              settled: Settled, error: BaseException | None) -> None:
        """Hand a sent release's final outcome over; one that failed is logged and
        counted here, since no caller hears it (the TTL reclaims the ticket)."""
        if error is not None:
            faults.noted("release", faults.STORE if isinstance(error, StoreError)
                         else faults.BUG, f"the release of ticket {ticket_id} on {provider} "
                         "failed; the TTL will reclaim it", error)
        try:
            settled(error)
        except Exception as failure:  # a loop callback: say so rather than lose it
            faults.noted("tickets", faults.BUG,
                         f"after the release of ticket {ticket_id} on {provider}", failure)

    async def renew(
        self, provider: str, ticket_id: str, *, ttl_seconds: float | None = None
    ) -> Ticket:
        """Push the ticket's expiry to now + TTL (for long calls); :class:`TicketGone`."""
        op = self._op(_RENEW, ticket_id, ttl_seconds=ttl_seconds or self.ttl_seconds)
        renewed = await self._submit(provider, op)
        assert renewed is not None
        return renewed

    def lease(self, provider: str, ticket_id: str) -> Lease:
        """A lease that renews the ticket every TTL/3 while its holder lives.

        Use it as ``async with tickets.lease(provider, ticket_id): ...`` around the
        work, or :meth:`Lease.start` and :meth:`Lease.stop` around a held plan.
        """
        return Lease(self, provider, ticket_id, clock=self._clock, ttl_seconds=self.ttl_seconds)

    async def update_state(self, provider: str, ticket_id: str, state: TicketState) -> Ticket:
        """Change what the ticket's memory is doing (held → loading → running).

        The holder is alive, so the expiry moves to now + TTL as well: a held plan
        taken by its call starts the call with a whole TTL.
        """
        changed = await self._submit(provider, self._op(_STATE, ticket_id, state=state))
        assert changed is not None
        return changed

    async def mark_running(self, provider: str, ticket_id: str) -> Ticket:
        """The call now runs on the ticket's copy."""
        return await self.update_state(provider, ticket_id, _RUNNING)

    @contextlib.asynccontextmanager
    async def claimed(
        self, provider: str, model: str, footprint_mib: int, holder_id: str,
        **options: Unpack[ClaimOptions],
    ) -> AsyncIterator[Ticket]:
        """:meth:`claim` for the duration of a block; the ticket is released when it ends."""
        ticket = await self.claim(provider, model, footprint_mib, holder_id, **options)
        try:
            yield ticket
        finally:
            try:
                # Shielded: a cancelled holder still gives its memory back at once.
                await asyncio.shield(self.release(provider, ticket.ticket_id))
            except StoreError as error:  # retried in the background; don't mask the body
                faults.noted("release", faults.STORE, f"release of ticket {ticket.ticket_id} "
                             "failed; tried again until the store answers or the TTL "
                             "reclaims it", error)

    # -- the per-provider combiner ---------------------------------------------------

    def _op(
        self, kind: OpKind, ticket_id: str, *, max_attempts: int | None = None, **kw: object
    ) -> _Op:
        future: asyncio.Future[Ticket | None] = asyncio.get_running_loop().create_future()
        attempts = max_attempts if max_attempts is not None else self.max_attempts
        if self._closing:  # queued while closing: no more tries than those before (_drain)
            attempts = min(attempts, self.max_attempts)
        return _Op(kind, ticket_id, future, attempts, **kw)  # type: ignore[arg-type]

    def _lane(self, provider: str) -> _Lane:
        lane = self._lanes.get(provider)
        if lane is None:
            lane = self._lanes[provider] = _Lane(provider)
        return lane

    async def _submit(self, provider: str, op: _Op) -> Ticket | None:
        if self._announcements is not None:
            self._announcements.follow()
        lanes = self._lanes
        lane = lanes[provider] if provider in lanes else self._lane(provider)
        lane.pending.append(op)
        lane.active_at = self._clock.now()
        waited: asyncio.Future[Ticket | None] | None = None
        if not lane.writing and (lane.task is None or lane.task.done()):
            if self._update_then is not None and self._write_at_once(provider, lane, op):
                # Settled as the acknowledgement is read, or already: awaited without
                # the shield, whose callbacks would cost two more loop turns. A caller
                # cancelled meanwhile cancels the future, and _finish gives back a
                # claim granted after all.
                waited = op.future
            else:
                lane.task = op.future.get_loop().create_task(self._serve(provider, lane))
        try:
            return await (_shielded(op.future) if waited is None else waited)
        except asyncio.CancelledError:
            # The caller gave up; a claim granted meanwhile must not leak until its TTL.
            if op.kind is _CLAIM:
                op.abandoned = True
                op.future.add_done_callback(lambda done: self._release_orphan(provider, done))
            raise

    def _release_orphan(self, provider: str, done: asyncio.Future[Ticket | None]) -> None:
        if done.cancelled() or done.exception() is not None or done.result() is None:
            return
        ticket = done.result()
        assert ticket is not None
        self._give_back(provider, ticket)

    def _give_back(self, provider: str, ticket: Ticket) -> None:
        """Release a ticket granted to a caller that no longer waits for it."""
        orphan = self._op(_RELEASE, ticket.ticket_id, max_attempts=self._release_attempts)

        def ended(done: asyncio.Future[Ticket | None]) -> None:
            if not done.cancelled() and isinstance(done.exception(), StoreError):
                self._retry_later(provider, ticket.ticket_id)  # an outage: later

        orphan.future.add_done_callback(ended)
        self._enqueue(provider, orphan)

    def _enqueue(self, provider: str, op: _Op) -> None:
        lane = self._lane(provider)
        lane.pending.append(op)
        lane.active_at = self._clock.now()
        if not lane.writing and (lane.task is None or lane.task.done()):
            lane.task = asyncio.get_running_loop().create_task(self._serve(provider, lane))

    async def _serve(self, provider: str, lane: _Lane,
                     failed: tuple[list[_Op], StoreError] | None = None) -> None:
        """Serve the lane's queue until it is empty. ``failed``: a write sent without
        the task (_write_at_once) for these operations failed so; that is taken up
        first, as if this task's own round had failed."""
        key = encode_token(provider)
        conflicts = 0
        outages = 0  # store failures in a row (no leader, timeouts): back off longer
        if failed is not None:
            conflicts, outages = await self._failed(lane, key, failed[0], failed[1],
                                                    own=True, conflicts=0, outages=0)
        while lane.pending:
            if (self._bus is not None and self._delegating(lane)
                    and await self._delegate(lane)):
                continue  # answered by the combiner, or back here to decide
            # (A lane that never lost a race, as in one process alone, skips the checks
            # of contention and of the watch below without a call.)
            if (lane.cached is not None and lane.lost_at is not None
                    and self._contended(lane) and lane.combining is None):
                # A winner holding the fresh revision would win again and again (the
                # losers must wait for the watch or read first), also across operations:
                # one claimer per process releases and claims again in tasks of their
                # own. Under recent contention step aside briefly instead. (A combiner
                # writes for everyone: it is meant to win again and again.)
                lane.cached = None
                await self._clock.sleep(
                    self._rng.uniform(self._backoff_base * 2, self._backoff_base * 6)
                )
            if (lane.followed is not None and self._contended(lane)
                    and lane.combining is None):
                # The lane lost a race moments ago: its new operations are announced
                # before their first try rather than after losing it, so the next write
                # by anyone carries them. In bench/kv.py's 20-process run, three runs
                # in turns each: 60.0, 87.7, 77.3 claims/s this way, 55.7, 56.0, 38.7
                # announcing after the first loss (load average 13 to 23).
                await self._announce(lane, lane.pending, eager=True)
            if lane.followed is not None:
                await self._wait_behind(lane)
            batch = list(lane.pending)
            cached, lane.cached = lane.cached, None
            own = cached is not None  # a copy this lane wrote: a loss on it is no race lost
            if lane.followed is not None:
                delivered = await self._delivered(lane, cached)
                if delivered is not None:
                    cached, own = delivered, False
            # One pass over the batch, every write's (no generator and call each):
            # whether a claim is to be decided afresh, and _known_state(batch).
            rereading = afresh = False
            last_claim: _Op | None = None
            for op in batch:
                if op.reread:
                    rereading = True
                if op.kind is _CLAIM:
                    last_claim = op
                    if op.known_state is None or op.reread or op.fresh_state:
                        afresh = True
            if rereading:
                cached = None  # a claim to decide afresh: read the document too
            known = (last_claim.known_state if last_claim is not None and not afresh
                     else None)
            retry: set[_Op] = set()  # claims to decide again on a freshly read state
            try:
                document: ProviderTickets
                revision: int | None
                state: ProviderState | None
                if known is not None and cached is not None:  # nothing to read
                    document, revision, state, delivered_state = (
                        cached[0], cached[1], known, False)
                else:
                    document, revision, state, delivered_state = await self._read_for(
                        lane, batch, cached, known
                    )
                if revision is not None and revision > lane.seen:  # max(), without a call
                    lane.seen = revision
                now = self._clock.now()
                fresh = cached is None or cached[1] >= lane.seen
                for op in batch:  # (most batches: nothing announced, nothing to answer)
                    if op.announced is not None:
                        answered = self._answer_announced(lane, batch, document, now,
                                                          fresh=fresh)
                        break
                else:
                    answered = False
                if answered and revision is not None and self._parsed is not None:
                    # Another process's write applied them: its revision is in no
                    # cache of this one, yet the view's note of them must not be
                    # undone by a delivery older than it.
                    self._parsed.heard(key, revision)
                foreign = False  # taken from another process: each may have lapsed
                for op in batch:
                    if op.foreign_until is not None:
                        foreign = True
                        break
                if (foreign and self._lapse_foreign(lane, batch, now)) or answered:
                    batch = [op for op in batch if not op.future.done()]
                    if not batch:
                        continue  # nothing of ours to write
                decision, results = self._apply(provider, document, state, now, batch)
                changed = decision.changed
                # A "no" stands only on fresh state: the state read now, and a document
                # read now or proven current by this batch's compare-and-set. A "no" on
                # the caller's copy of the state, on the copy this lane last wrote or on
                # one the watch delivered may be that copy's age (another process
                # released meanwhile): those claims stay queued and are decided again
                # on a fresh read. So may a "no" on the state the watch delivered.
                if (known is not None or delivered_state
                        or (cached is not None and not changed)):
                    for op in batch:
                        if op.kind is _CLAIM and isinstance(
                            results[op], ClaimRejected
                        ):
                            op.reread = True
                            retry.add(op)
                if changed:
                    written = decision.document(provider)
                    encoder = lane.encoder
                    if encoder is None:
                        encoder = lane.encoder = TicketEncoder(provider)
                    value = encoder.encode(written)
                    if revision is None:
                        new_revision = await self._tickets.create(key, value)
                    else:
                        new_revision = await self._tickets.update(
                            key, value, expected_revision=revision
                        )
                    self._wrote(lane, key, written, value, new_revision)
                elif revision is not None and not retry:
                    lane.cached = (document, revision)
            except (RevisionMismatch, KeyExists, StoreUnavailable) as error:
                conflicts, outages = await self._failed(lane, key, batch, error, own=own,
                                                        conflicts=conflicts, outages=outages)
                continue
            except Exception as error:  # a bad document or a bug: fail this batch, not the lane
                faults.noted(
                    "tickets", faults.UNREADABLE if isinstance(error, ValueError) else faults.BUG,
                    f"ticket operations on {provider} failed", error,
                )
                for op in batch:
                    self._finish(lane, op, error=error)
                continue
            outages = 0
            lane.combiner_losses = 0
            if self._announcements is not None:  # written: forget what it settled
                self._announcements.settle(decision.settled, decision.found_settled)
            for op in batch:
                if op not in retry:
                    self._finish(lane, op, result=results[op])  # every op has an outcome
            if conflicts:  # max(0, conflicts - 1)
                conflicts -= 1
        if lane.combining is not None:
            self._resign_when_idle(lane)

    def _wrote(self, lane: _Lane, key: str, written: ProviderTickets, value: bytes,
               revision: int) -> None:
        """The lane's document was written as ``written`` (``value``) at ``revision``."""
        lane.cached = (written, revision)
        if revision > lane.seen:
            lane.seen = revision
        if self._parsed is not None:
            self._parsed.prime(key, revision, written)
        if lane.combining is None:
            lane.wrote_at = self._clock.now()
        if lane.followed is not None and self._documents is not None:
            self._documents.noted(key, value, revision)

    async def _failed(self, lane: _Lane, key: str, batch: list[_Op], error: StoreError, *,
                      own: bool, conflicts: int, outages: int) -> tuple[int, int]:
        """A round's write of ``batch`` lost a race or found the store unavailable: what
        the next round must know, and the wait before it. ``own``: the round decided on
        the copy this lane wrote. The lane's conflicts and outages in a row after it."""
        provider = lane.provider
        for op in batch:
            # The next attempt reads the state: a lost race may mean the card
            # changed too. The document comes from the watch when it follows.
            op.fresh_state = op.fresh_state or op.kind is _CLAIM
            if isinstance(error, StoreUnavailable):
                op.reread = op.reread or op.kind is _CLAIM
        if isinstance(error, RevisionMismatch | KeyExists):
            metrics.CAS_CONFLICTS.inc()
            lane.lost_at = self._clock.now()
            lane.lost_on = lane.seen  # the newest revision known lost the race
            if self._bus is not None and any(op.delegable for op in batch):
                return conflicts, outages  # the next round sends them to the combiner
            self._follow(lane, key)
            if own:
                return conflicts, outages  # the kept copy was stale: decide again, no penalty
        conflicts += 1
        self._count_attempt(lane, batch, provider, error)
        if isinstance(error, StoreUnavailable):
            outages += 1
            await self._clock.sleep(self._outage_backoff(outages))
        elif lane.combining is not None:
            lane.combiner_losses += 1
            if lane.combiner_losses >= _COMBINER_LOSSES:
                # Someone else keeps writing (a process that lost no race, or
                # one this combiner cannot outpace): what it holds goes into the
                # line for that writer to apply, and new senders stop coming.
                await self._resign(lane, wait=False)
            # Announced, what it holds is applied by whoever writes next; others wait on
            # its write: at once, on the revision that won.
            await self._announce(lane, batch)
        elif await self._announce(lane, batch):
            # Just announced: try again at once. The processes that lost this
            # round announce together, and the next write any of them wins
            # serves them all; waiting out a backoff here left nobody writing.
            await self._pause(lane, self._rng.uniform(0.0, self._backoff_base))
        else:
            await self._pause(lane, self._backoff(conflicts))
        return conflicts, outages

    # -- an idle lane's operation written in its caller's turn -----------------------

    def _write_at_once(self, provider: str, lane: _Lane, op: _Op) -> bool:
        """Decide ``op``, the idle lane's only operation, now and send its write with
        the store's ``update_then``; whether that was done (the operation is then
        settled as the acknowledgement is read, or already when nothing needed
        writing). False, with nothing done: the lane's task serves it as before.

        Through the task an uncontended claim or release cost the task's start, a loop
        turn for it to write, one for it to wake to the acknowledgement and two for the
        shield before its caller woke: on NATS, half the loop turns of a place + claim
        + release. This is the task's first round, for the plainest case only: the lane
        holds the document it wrote or read last, lost no race lately, follows no
        watch and has no combiner to ask; the operation was not announced or taken
        from another process; a claim brings the caller's state and is granted on it
        (a refusal is left to the task, whose round decides it again on a fresh read);
        a release meets no announced request. A lost race, an outage or a bug after the
        write is sent goes on in the lane's task as it would have there.
        """
        cached = lane.cached
        if (cached is None or lane.followed is not None or len(lane.pending) != 1
                or op.reread or op.fresh_state or op.announced is not None
                or op.foreign_until is not None or op.delegated
                or (lane.lost_at is not None and self._contended(lane))
                or (self._bus is not None and self._delegating(lane))):
            return False
        update_then = self._update_then
        assert update_then is not None
        if op.kind is _CLAIM:
            state = op.known_state
            if state is None:
                return False
        else:
            state = None
            if self._announcements is not None and self._announcements.pending(provider):
                return False  # a claim among them is judged on a state read now
        document, revision = cached
        batch = lane.pending[:]
        try:
            decision, results = self._apply(provider, document, state, self._clock.now(),
                                            batch)
        except Exception:
            return False  # the task meets it again, and fails the operation as it fails any
        result = results[op]
        if op.kind is _CLAIM and result.__class__ is not Ticket:
            # Refused on the caller's state, which may be that copy's age: the task's
            # round decides it again on a fresh read before its caller hears "no".
            return False
        if not decision.changed:  # the round's end without a write: the copy is kept
            self._round_settled(lane, decision)
            self._finish(lane, op, result=result)
            return True
        written = decision.document(provider)
        encoder = lane.encoder
        if encoder is None:
            encoder = lane.encoder = TicketEncoder(provider)
        value = encoder.encode(written)
        key = encode_token(provider)

        def heard(outcome: int | Exception) -> None:
            self._heard(lane, key, op, decision, result, written, value, outcome)

        if not update_then(key, value, revision, heard):
            return False
        lane.cached = None  # until the acknowledgement says whether the write won
        lane.writing = True
        return True

    def _heard(self, lane: _Lane, key: str, op: _Op, decision: Decision,
               result: Ticket | BaseException | None, written: ProviderTickets,
               value: bytes, outcome: int | Exception) -> None:
        """The acknowledgement of a write :meth:`_write_at_once` sent: the new revision,
        or why it failed. Runs in the store's turn (it must not raise there)."""
        lane.writing = False
        failed: tuple[list[_Op], StoreError] | None = None
        try:
            if not isinstance(outcome, Exception):
                self._wrote(lane, key, written, value, outcome)
                self._round_settled(lane, decision)
                self._finish(lane, op, result=result)
            elif isinstance(outcome, RevisionMismatch | KeyExists | StoreUnavailable):
                failed = ([op], outcome)
            else:
                raise outcome
        except Exception as error:  # a bad answer or a bug: this operation fails, not the lane
            faults.noted("tickets", faults.UNREADABLE if isinstance(error, ValueError)
                         else faults.BUG, f"ticket operations on {lane.provider} failed", error)
            self._finish(lane, op, error=error)
        finally:
            if lane.pending and (lane.task is None or lane.task.done()):
                lane.task = asyncio.get_running_loop().create_task(
                    self._serve(lane.provider, lane, failed))
            if lane.written is not None:
                lane.written.set_result(None)
                lane.written = None

    def _round_settled(self, lane: _Lane, decision: Decision) -> None:
        """A round of :meth:`_write_at_once` ended without an error, as the task's do:
        no combiner loss in a row, and the announcements it settled forgotten."""
        lane.combiner_losses = 0
        if self._announcements is not None:
            self._announcements.settle(decision.settled, decision.found_settled)

    # -- the provider's combiner (kubemoot.runtime.ticket_delegation) ----------------

    def _delegating(self, lane: _Lane) -> bool:
        """Whether the lane's operations go to the provider's combiner now: it lost a
        race lately, or a combiner answered it lately, or it is the combiner (its own
        operations take the same way as everyone's, so they queue behind the ones that
        came first: taken straight into its queue, the combiner's own claimers were
        served four times as often as the others' in bench/kv.py's 4-process run)."""
        if self._bus is None:
            return False
        if lane.combining is not None or self._contended(lane):
            return True
        return self._recently_delegated(lane) or self._probing(lane)

    def _recently_delegated(self, lane: _Lane) -> bool:
        return (lane.delegated_at is not None
                and self._clock.now() - lane.delegated_at < _DELEGATE_SECONDS)

    def _probing(self, lane: _Lane) -> bool:
        """Whether a lane that lost no race should ask for a combiner before writing:
        it wrote moments ago (a busy lane), and it did not find none lately. A busy
        lane that writes straight on the revision it wrote last wins every race, and
        while it writes nobody else's operations get written: in bench/kv.py's
        20-process run one process once got 530 claims to the others' 13 to 29."""
        now = self._clock.now()
        return (lane.wrote_at is not None and now - lane.wrote_at < _BUSY_SECONDS
                and (lane.probed_at is None or now - lane.probed_at >= _PROBE_SECONDS))

    async def _delegate(self, lane: _Lane) -> bool:
        """Send the lane's delegable operations to the provider's combiner; whether
        any were sent. Their answers come in a task of their own, so operations queued
        meanwhile are sent at once rather than after the answer."""
        bus = self._bus
        due = [op for op in lane.pending if op.delegable]
        if bus is None or not due:
            return False
        provider = lane.provider
        until = self._clock.now() + self._request_seconds
        requests = [
            TicketRequest(
                provider=provider, ticket_id=op.ticket_id, ticket=op.ticket,
                condition=op.condition, expires_at=until,
                kind=_REQUEST_CLAIM if op.kind is _CLAIM else _REQUEST_RELEASE,
            ) for op in due
        ]
        self._combined += len(due)
        taken = set(map(id, due))
        lane.pending[:] = [op for op in lane.pending if id(op) not in taken]
        payload = AnnouncedRequests(provider=provider, requests=requests).to_json()
        probe = not (lane.combining is not None or self._contended(lane)
                     or self._recently_delegated(lane))
        task = asyncio.get_running_loop().create_task(
            self._send(lane, bus, due, payload, until, probe=probe))
        self._replying.add(task)
        task.add_done_callback(self._replying.discard)
        return True

    async def _send(self, lane: _Lane, bus: Bus, due: list[_Op], payload: bytes,
                    until: float, *, again: bool = False, probe: bool = False) -> None:
        """Send operations to the combiner and finish them with its answers; those it
        did not decide go back to the lane, to be decided there."""
        provider = lane.provider
        try:
            data = await bus.request(delegation.subject(provider), payload,
                                     timeout=self._request_seconds)
            replies = {r.ticket_id: r for r in delegation.decode_replies(data)}
        except NoResponders:
            if probe:  # no contention seen, and nobody combines: write them here
                lane.probed_at = self._clock.now()
                self._requeue(lane, due)
                return
            if not again:
                # Every process that lost the same race asks at the same moment: a
                # moment's jitter lets the first to listen take the others' requests
                # rather than all of them listening and racing one another.
                await self._clock.sleep(self._rng.uniform(0.0, self._backoff_base * 10))
                await self._send(lane, bus, due, payload, until, again=True)
                return
            await self._combine(lane)  # nobody combines: this lane does from now on
            if lane.combining is None:
                for op in due:  # it could not listen: decide them here
                    op.delegated = True
            self._requeue(lane, due)
            return
        except (BusError, ValueError) as error:
            # The combiner went away or answered nonsense: decide them here, as
            # announced ones (a claim given up on is withdrawn, in case it still writes).
            log.debug("the combiner of %s did not answer: %s", provider, error)
            replies = {}
        if replies and self._parsed is not None:
            # The combiner's write is in no cache of this process: made known, the
            # view's note of these operations is not undone by an older delivery.
            newest = max(reply.revision for reply in replies.values())
            if newest:
                self._parsed.heard(encode_token(provider), newest)
        lane.active_at = self._clock.now()
        back: list[_Op] = []
        for op in due:
            reply = replies.get(op.ticket_id)
            if reply is None or reply.result == delegation.LAPSED:
                op.delegated = True
                if op.kind is _CLAIM:
                    op.announced_until = until
                back.append(op)
                continue
            lane.delegated_at = lane.active_at
            self._finish(lane, op, result=self._answer(provider, op, reply))
        if back:
            self._requeue(lane, back)
        elif (lane.delegated_at == lane.active_at and lane.combining is None
              and lane.followed is not None and not lane.pending):
            # Answered by a combiner and nothing left to write here: stop following,
            # or every document the combiner writes wakes this process for nothing.
            await self._unfollow(lane)

    def _requeue(self, lane: _Lane, ops: list[_Op]) -> None:
        """Put operations back at the head of the lane's queue (they came first)."""
        lane.pending[:0] = [op for op in ops if not op.future.done()]
        if lane.pending and not lane.writing and (lane.task is None or lane.task.done()):
            lane.task = asyncio.get_running_loop().create_task(
                self._serve(lane.provider, lane))

    def _answer(self, provider: str, op: _Op,
                reply: delegation.Reply) -> Ticket | BaseException | None:
        """The combiner's answer as this lane's caller gets it."""
        result = reply.result
        if result == delegation.GRANTED and op.kind is _CLAIM:
            return reply.ticket
        if result == delegation.REFUSED and op.ticket is not None:
            return ClaimRejected(provider, op.ticket.model, op.ticket.model_footprint_mib,
                                 reply.reason)
        if result == delegation.GONE:
            return TicketGone(f"ticket {op.ticket_id} on {provider} is gone "
                              "(released or expired)")
        if result == delegation.CONFLICT:
            return ClaimConflict(reply.reason)
        if result == delegation.UNAVAILABLE:
            return StoreUnavailable(reply.reason)
        return None  # released

    async def _combine(self, lane: _Lane) -> None:
        """Listen as the provider's combiner (nobody did when this lane asked)."""
        bus = self._bus
        if bus is None or lane.combining is not None or lane.joining:
            return
        provider = lane.provider

        async def take(message: Message) -> None:
            self._take_foreign(provider, message)

        lane.joining = True
        try:
            lane.combining = await bus.subscribe(delegation.subject(provider), take,
                                                 queue=delegation.QUEUE)
        except BusError as error:
            faults.noted("tickets", faults.STORE, f"combining for {provider}", error)
            return
        finally:
            lane.joining = False
        lane.active_at = self._clock.now()
        lane.rank = self._rng.getrandbits(63)
        task = asyncio.get_running_loop().create_task(self._roll_call(lane, bus))
        self._replying.add(task)
        task.add_done_callback(self._replying.discard)
        # It writes for everyone from now on: the revisions that beat it and the state
        # come from the watches, not from reads.
        self._follow(lane, encode_token(provider))

    async def _roll_call(self, lane: _Lane, bus: Bus) -> None:
        """Meet the provider's other combiners: every one answers with its rank, and
        whichever learns of a lower rank than its own stops combining, so that of
        those that started together (every process that lost the same race found
        nobody listening at the same moment) one stays. Each combiner takes a share of
        the requests and follows every document written; several racing one another
        lost most of their writes."""
        roll = f"{delegation.subject(lane.provider)}.roll"
        mine = lane.rank

        async def answer(message: Message) -> None:
            if lane.combining is None or lane.rank != mine:
                return
            with contextlib.suppress(BusError):
                await bus.publish(message.reply, str(mine).encode())
            with contextlib.suppress(ValueError):
                if int(message.data) < mine:
                    await self._resign(lane, wait=False)

        try:
            lane.roll.append(await bus.subscribe(roll, answer))
            ranks = await bus.gather(roll, str(mine).encode(), window=_ROLL_CALL_SECONDS)
        except BusError as error:
            log.debug("the roll call of %s's combiners failed: %s", lane.provider, error)
            return
        others = []
        for rank in ranks:
            with contextlib.suppress(ValueError):
                others.append(int(rank))
        if lane.combining is not None and lane.rank == mine and any(r < mine for r in others):
            await self._resign(lane, wait=False)

    async def _resign(self, lane: _Lane, *, wait: bool = True) -> None:
        """Stop combining for the lane's provider. Requests sent to it before the
        server learned so are still taken and answered (the subscription is drained):
        dropped, each would cost its sender a whole request time. ``wait``: until then
        (otherwise that goes on in a task of its own, and the lane is free at once)."""
        combining, lane.combining = lane.combining, None
        if combining is None:
            return
        lane.combiner_losses = 0
        for extra in lane.roll:
            await extra.unsubscribe()
        lane.roll = []
        # What it took from others goes back to them: a combiner that stops (it cannot
        # outpace another writer, or another combiner stays) may never write them, and
        # their senders would wait out the whole request time. Announced ones stay in
        # the line for whoever writes.
        for op in [op for op in lane.pending if op.foreign_until is not None]:
            self._finish(lane, op, error=_Lapsed(
                f"{op.kind.value} of ticket {op.ticket_id}: its combiner stopped"))
        if wait:
            await combining.drain()
            return
        task = asyncio.get_running_loop().create_task(self._stop_combining(lane, combining))
        self._replying.add(task)
        task.add_done_callback(self._replying.discard)

    async def _stop_combining(self, lane: _Lane, combining: Subscription) -> None:
        """Drain the subscription, then stop following the lane's provider: its
        operations go to the combiner now, and every document written there would
        otherwise wake this process for nothing."""
        await combining.drain()
        if lane.combining is not None:
            return  # combining again meanwhile
        await self._unfollow(lane)

    async def _unfollow(self, lane: _Lane) -> None:
        """Stop following the lane's document and state (a later lost race follows
        them again, from a fresh read)."""
        key = encode_token(lane.provider)
        lane.followed = lane.state = None
        lane.cached = None
        if self._documents is not None:
            await self._documents.forget(key)
        if self._followed_states is not None:
            await self._followed_states.forget(key)

    def _resign_when_idle(self, lane: _Lane) -> None:
        """Stop combining once the lane has been idle for ``combine_idle_seconds``."""
        if lane.resigning is not None and not lane.resigning.done():
            return

        async def later() -> None:
            while lane.combining is not None:
                left = lane.active_at + self.combine_idle_seconds - self._clock.now()
                if left <= 0 and not lane.pending:
                    await self._resign(lane, wait=False)
                    return
                await self._clock.sleep(max(left, self.combine_idle_seconds / 10))

        lane.resigning = asyncio.get_running_loop().create_task(later())

    def _take_foreign(self, provider: str, message: Message) -> None:
        """Queue the operations another process sent, and answer when all are done.

        Nothing here waits: the bus hands a subscription's messages over one after the
        other, and a request waiting for its write would hold up the next sender's.
        """
        try:
            sent = AnnouncedRequests.from_json(message.data)
        except ValueError as error:
            faults.noted("tickets", faults.UNREADABLE, "operations sent to the combiner",
                         error)
            return
        ops: list[_Op] = []
        for request in sent.requests:
            if request.provider != provider:
                continue
            claim = request.kind is _REQUEST_CLAIM
            op = self._op(
                _CLAIM if claim else _RELEASE, request.ticket_id,
                ticket=request.ticket, condition=request.condition,
                max_attempts=self.max_attempts if claim else self._release_attempts,
                foreign_until=request.expires_at,
                # a grant marks it served until then, as an announced claim's does
                announced_until=request.expires_at if claim else None,
            )
            ops.append(op)
            self._enqueue(provider, op)
        self._combined += len(ops)
        task = asyncio.get_running_loop().create_task(self._reply(message.reply, ops))
        self._replying.add(task)
        task.add_done_callback(self._replying.discard)

    async def _reply(self, to: str, ops: list[_Op]) -> None:
        if ops:
            await asyncio.wait([op.future for op in ops])
        replies: list[delegation.Reply] = []
        for op in ops:
            error = (_Lapsed("cancelled") if op.future.cancelled()
                     else op.future.exception())
            result = None if error is not None else op.future.result()
            if isinstance(error, ClaimRejected):
                replies.append(delegation.Reply(op.ticket_id, delegation.REFUSED,
                                                reason=error.reason, revision=op.revision))
            elif isinstance(error, TicketGone):
                replies.append(delegation.Reply(op.ticket_id, delegation.GONE,
                                                revision=op.revision))
            elif isinstance(error, ClaimConflict):
                replies.append(delegation.Reply(op.ticket_id, delegation.CONFLICT,
                                                reason=str(error)))
            elif isinstance(error, StoreUnavailable):
                replies.append(delegation.Reply(op.ticket_id, delegation.UNAVAILABLE,
                                                reason=str(error)))
            elif error is not None:  # lapsed here, or failed for a reason of this process
                replies.append(delegation.Reply(op.ticket_id, delegation.LAPSED,
                                                reason=str(error)))
            elif op.kind is _CLAIM:
                replies.append(delegation.Reply(
                    op.ticket_id, delegation.GRANTED if result is not None
                    else delegation.LAPSED, ticket=result, revision=op.revision))
            else:
                replies.append(delegation.Reply(op.ticket_id, delegation.RELEASED,
                                                revision=op.revision))
        if not to or self._bus is None:
            return
        try:
            await self._bus.publish(to, delegation.encode_replies(replies))
        except BusError as error:  # its sender decides them itself when no answer comes
            log.debug("answering a sender of ticket operations failed: %s", error)

    def _lapse_foreign(self, lane: _Lane, batch: list[_Op], now: float) -> bool:
        """Finish the operations taken from other processes whose time is up (their
        senders decide them themselves now); whether any was."""
        lapsed = False
        for op in batch:
            if op.foreign_until is not None and op.foreign_until <= now:
                self._finish(lane, op, error=_Lapsed(
                    f"{op.kind.value} of ticket {op.ticket_id}: its request lapsed"))
                lapsed = True
        return lapsed

    def _follow(self, lane: _Lane, key: str) -> None:
        """Follow the lane's document from now on (the line is on and a race was lost)."""
        if self._documents is not None and (
            lane.followed is None or not self._documents.following
        ):
            lane.followed = self._documents.follow(key, lane.wake)
        if self._followed_states is not None and (
            lane.state is None or not self._followed_states.following
        ):
            lane.state = self._followed_states.follow(key)

    async def _delivered(
        self, lane: _Lane, cached: tuple[ProviderTickets, int] | None
    ) -> tuple[ProviderTickets, int] | None:
        """The followed document when the watch delivered a newer revision than
        ``cached``; after a lost race, the revision that beat it is waited for briefly
        (it is usually on its way already) rather than read."""
        followed = lane.followed
        if followed is None:
            return None
        lost, lane.lost_on = lane.lost_on, None
        if cached is None and lost is not None and followed.revision <= lost:
            followed.changed.clear()
            await self._until(followed.changed, self._backoff_base * 5)
        # Only a revision newer than what this lane knows lost, and not older than the
        # newest it has read or written, is worth a compare-and-set.
        stale = cached[1] if cached is not None else lost if lost is not None else 0
        if (followed.value is None or followed.revision <= stale
                or followed.revision < lane.seen):
            return None
        lane.seen = max(lane.seen, followed.revision)
        return ProviderTickets.from_json(followed.value), followed.revision

    async def _wait_behind(self, lane: _Lane) -> None:
        """Let an older announcer's write go first, for at most ``_BEHIND_SECONDS``.

        An announced operation whose provider has an older announcement not yet settled
        in the delivered document would race that announcer's process, and every
        process racing at once made most compare-and-sets lose (1.6 lost per granted
        claim with twenty processes). Whoever serves the oldest serves this one in the
        same write, and the delivery that shows it ends the wait; the cap keeps a line
        moving whose oldest announcer went away. Only a lane with one operation waits
        (one claimer per process, every agent pod): a lane holding several carries them
        all in its own write, and holding it back stalled all of them while a process
        that had lost no race wrote freely (bench/kv.py, 20 claimers in 4 processes,
        one run each: fairness 0.30, p99 60 ms waiting with any number; 0.97, 22 ms
        waiting with one).
        """
        announcements, followed = self._announcements, lane.followed
        if announcements is None or followed is None or len(lane.pending) > 1:
            return
        keys = {op.announced for op in lane.pending if op.announced is not None}
        deadline = self._clock.now() + _BEHIND_SECONDS
        while any(announcements.behind(lane.provider, key, followed.value) for key in keys):
            left = deadline - self._clock.now()
            if left <= 0:
                return
            lane.wake.clear()
            await self._until(lane.wake, left)
            if self._answerable(lane):
                return

    async def _announce(self, lane: _Lane, batch: list[_Op], *, eager: bool = False) -> bool:
        """Announce the batch's claims and releases that lost races (once each), so
        that whichever process writes the document next applies them, in order;
        whether any was announced now. ``eager``: before their first try as well."""
        announcements = self._announcements
        if announcements is None:
            return False
        due = [op for op in batch if not op.future.done() and op.announceable
               and (eager or op.attempts >= _ANNOUNCE_AFTER_LOSSES)]
        if not due:
            return False
        requests = [
            announcements.request(
                lane.provider, op.ticket_id, ticket=op.ticket, condition=op.condition,
                kind=_REQUEST_CLAIM if op.kind is _CLAIM else _REQUEST_RELEASE,
            ) for op in due
        ]
        # One key for all of them, as the write that lost carried them all.
        key = await announcements.announce(lane.provider, requests, lane.wake)
        if key is None:
            return False
        for op, request in zip(due, requests, strict=True):
            op.announced, op.announced_until = key, request.expires_at
        return True

    def _answer_announced(self, lane: _Lane, batch: list[_Op], document: ProviderTickets,
                          now: float, *, fresh: bool) -> bool:
        """Answer the announced operations another process already applied, as read.

        Their answer no longer depends on this lane's write, and a write now would also
        carry the announcements still pending, which makes it likely to lose: an answer
        held back until this lane wins a race would keep the announcer waiting for
        nothing. A claim is granted once its ticket is in any committed revision; a
        release is done once its ticket is absent from a revision just read (a copy this
        lane kept could predate the grant). Whether any was answered.
        """
        if self._announcements is None or all(op.announced is None for op in batch):
            return False  # (the usual case: nothing of the batch was announced)
        present = {t.ticket_id: t for t in document.active(now)}
        answered = False
        for op in batch:
            if op.announced is None or op.future.done():
                continue
            if op.kind is _CLAIM and op.ticket_id in present:
                self._finish(lane, op, result=present[op.ticket_id])
                answered = True
            elif op.kind is _RELEASE and fresh and op.ticket_id not in present:
                self._finish(lane, op, result=None)
                answered = True
        return answered

    async def _pause(self, lane: _Lane, seconds: float) -> None:
        """Back off; a delivered document that answers an announced operation (its
        ticket granted, or released) ends it early, and so does the deletion of an
        announcement by the writer that settled it."""
        if not any(op.announced for op in lane.pending):
            await self._clock.sleep(seconds)
            return
        deadline = self._clock.now() + seconds
        while (left := deadline - self._clock.now()) > 0:
            if not await self._until(lane.wake, left):
                break
            lane.wake.clear()
            if self._answerable(lane):
                break
        lane.wake.clear()

    async def _until(self, event: asyncio.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` passed; whether it was set.

        The time passes by the injected clock's ``sleep``, as every backoff here does:
        a manual clock advances itself for it (a test never has to move the clock for a
        claim to go on), a virtual loop's costs nothing real.
        """
        if event.is_set():
            return True
        waiter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
        return event.is_set()

    def _answerable(self, lane: _Lane) -> bool:
        """Whether the newest delivered document answers one of the lane's announced
        operations, by a look at its bytes (a ticket id is in them or not), or another
        writer deleted an announcement (the old signal)."""
        followed = lane.followed
        value = None if followed is None else followed.value
        for op in lane.pending:
            if op.announced is None:
                continue
            if self._announcements is not None and self._announcements.gone(op.announced):
                return True
            if value is not None and (op.ticket_id.encode() in value) is (
                op.kind is _CLAIM
            ):
                return True
        return False

    async def _read_for(
        self,
        lane: _Lane,
        batch: list[_Op],
        cached: tuple[ProviderTickets, int] | None,
        known: ProviderState | None,
    ) -> tuple[ProviderTickets, int | None, ProviderState | None, bool]:
        """The ticket document (cached or read), when a claim needs it the state, and
        whether that state is the watch's delivery rather than read now."""
        provider = lane.provider
        if known is not None:  # the callers hold the state: at most the document is read
            if cached is not None:
                return cached[0], cached[1], known, False
            document, revision = await self.read(provider)
            return document, revision, known, False
        needs_state = any(op.kind is _CLAIM for op in batch) or any(
            r.kind is _REQUEST_CLAIM for r in self.announced(provider)
        )  # another process's announced claim is judged on the budget too
        # After a lost race the watch delivers the state; a claim refused on it is
        # decided again on a read one (``reread``) before its caller hears "no".
        delivered = (None if not needs_state or any(op.reread for op in batch)
                     else self._delivered_state(lane))
        if delivered is not None:
            if cached is not None:
                return cached[0], cached[1], delivered, True
            document, revision = await self.read(provider)
            return document, revision, delivered, True
        if cached is not None:
            state = await self._state(provider) if needs_state else None
            return cached[0], cached[1], state, False
        if not needs_state:  # releases and renewals do not consult the budget
            document, revision = await self.read(provider)
            return document, revision, None, False
        (document, revision), state = await asyncio.gather(
            self.read(provider), self._state(provider)
        )
        return document, revision, state, False

    def _contended(self, lane: _Lane) -> bool:
        """Whether the lane lost a race lately (within the backoff cap, a few turns)."""
        return lane.lost_at is not None and (
            self._clock.now() - lane.lost_at < self._backoff_cap * _CONTENDED_TURNS
        )

    def _backoff(self, conflicts: int) -> float:
        # Jittered so losers do not collide again in lockstep, and *longer* the more a
        # lane has lost in a row (doubling to the cap). A shrinking wait was tried for the
        # longest waiter's sake: with twenty processes it had every loser retry within a
        # millisecond, each retry moved the revision away from the others, and the
        # provider served ~35 claims/s (bench/kv.py); spreading the retries out lets a
        # read survive until its write lands.
        ceiling = min(self._backoff_cap, self._backoff_base * 2 ** min(conflicts, 30))
        return self._rng.uniform(0.0, ceiling)

    def _outage_backoff(self, outages: int) -> float:
        # Unlike a lost race, an unavailable store (a stream electing its leader answers
        # "temporarily unavailable" at once) is not helped by trying sooner: a shrinking
        # wait would spin hundreds of requests a second at a cluster busy electing. The
        # ceiling doubles with each failure in a row, up to the cap; jittered.
        ceiling = min(self._backoff_cap, self._backoff_base * 2 ** min(outages, 30))
        return self._rng.uniform(0.0, ceiling)

    def _count_attempt(
        self, lane: _Lane, batch: list[_Op], provider: str, error: StoreError
    ) -> None:
        now = self._clock.now()
        for op in batch:
            op.attempts += 1
            if op.attempts < op.max_attempts:
                continue
            in_line = (((op.announced is not None or op.delegated)
                       and (op.announced_until or 0.0) > now)
                       or (op.foreign_until or 0.0) > now)
            if in_line and not isinstance(error, StoreUnavailable):
                continue  # announced: it waits for its turn until the announcement lapses
            if isinstance(error, StoreUnavailable):
                self._finish(lane, op, error=error)
            else:
                self._finish(lane, op, error=ClaimConflict(
                    f"{op.kind.value} of ticket {op.ticket_id} on {provider}: lost "
                    f"{op.attempts} compare-and-set races in a row"
                ))

    def _finish(
        self,
        lane: _Lane,
        op: _Op,
        *,
        result: Ticket | BaseException | None = None,
        error: BaseException | None = None,
    ) -> None:
        pending = lane.pending
        if op in pending:  # not contextlib.suppress: every operation passes here
            pending.remove(op)
        if op.foreign_until is not None:
            op.revision = lane.seen
        announced = op.announced is not None
        if op.announced is not None and self._announcements is not None:
            self._announcements.answered(op.announced, op.ticket_id)
            op.announced = None
        # A request handed back to its sender (lapsed here) is the sender's to decide,
        # and to withdraw if it gives up; its announcement stays for writers to apply.
        if (announced or op.delegated) and not isinstance(error, _Lapsed):
            granted = error is None and isinstance(result, Ticket)
            if op.kind is _CLAIM and not granted and op.announced_until is not None:
                # Its caller hears "no", yet a writer that saw the announcement could
                # still grant it: a release that marks it served forbids that, and
                # undoes a grant that already happened.
                withdraw = self._op(_RELEASE, op.ticket_id,
                                    max_attempts=self._release_attempts,
                                    withdraw_until=op.announced_until)
                withdraw.future.add_done_callback(lambda f: f.cancelled() or f.exception())
                self._enqueue(lane.provider, withdraw)
        future = op.future
        if future.done():
            if (future.cancelled() and error is None and op.kind is _CLAIM
                    and isinstance(result, Ticket)):
                # Its caller awaited the future itself (_write_at_once) and was
                # cancelled: the claim granted after all goes back at once.
                self._give_back(lane.provider, result)
            return
        # A ticket or nothing, the outcome of most operations, is settled without the
        # isinstance() calls below; the answers are the same.
        if error is not None:
            future.set_exception(error)
        elif result is None or result.__class__ is Ticket:
            future.set_result(result)
        elif isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result if isinstance(result, Ticket) else None)

    def _apply(
        self,
        provider: str,
        document: ProviderTickets,
        state: ProviderState | None,
        now: float,
        batch: list[_Op],
    ) -> tuple[Decision, dict[_Op, Ticket | BaseException | None]]:
        """Decide every queued operation in order; each outcome as the caller gets it."""
        announced = (() if self._announcements is None
                     else self._announcements.pending(provider))
        decision = decide(document, state, now, [op.request(self.ttl_seconds) for op in batch],
                          line_seconds=self.line_seconds, announced=announced)
        # keyed by the operation itself: an _Op compares and hashes by identity
        results: dict[_Op, Ticket | BaseException | None] = {}
        for op, outcome in zip(batch, decision.outcomes, strict=True):
            if outcome is None or outcome.__class__ is Ticket:  # most: no isinstance()
                results[op] = outcome
            elif isinstance(outcome, Refused):
                assert op.ticket is not None
                results[op] = ClaimRejected(provider, op.ticket.model,
                                                op.ticket.model_footprint_mib, outcome.reason)
            elif isinstance(outcome, Gone):
                results[op] = TicketGone(
                    f"ticket {op.ticket_id} on {provider} is gone (released or expired)")
            else:
                results[op] = outcome
        return decision, results


def _shielded(inner: asyncio.Future[Ticket | None]) -> asyncio.Future[Ticket | None]:
    """``asyncio.shield(inner)`` for an operation's own future: the same two callbacks,
    so the caller resumes on the same loop turn (the simulator's decisions depend on
    the turns), without shield's checks of what it was given (one per operation)."""
    if inner.done():
        return inner
    outer: asyncio.Future[Ticket | None] = inner.get_loop().create_future()

    def inner_done(inner: asyncio.Future[Ticket | None]) -> None:
        if outer.cancelled():
            if not inner.cancelled():
                inner.exception()  # retrieved: a cancelled caller's error is not logged
            return
        if inner.cancelled():
            outer.cancel()
        elif (error := inner.exception()) is not None:
            outer.set_exception(error)
        else:
            outer.set_result(inner.result())

    def outer_done(_outer: asyncio.Future[Ticket | None]) -> None:
        if not inner.done():
            inner.remove_done_callback(inner_done)

    inner.add_done_callback(inner_done)
    outer.add_done_callback(outer_done)
    return outer


def _end(ended: asyncio.Future[None], _busy: object) -> None:
    """Resolve ``ended`` unless its waiter was cancelled (:meth:`TicketManager.quiet`)."""
    if not ended.done():
        ended.set_result(None)


def ticket_id_of(bits: int) -> str:
    """``str(uuid.UUID(int=bits, version=4))``, the same text without the class: the
    variant and version bits set as :class:`uuid.UUID` sets them, then the hex in its
    five groups (a claim makes one; the class's checks and frames cost more than the
    rest of making the ticket's id)."""
    bits = (bits & ~(0xC000 << 48) | 0x8000 << 48) & ~(0xF000 << 64) | 4 << 76
    text = f"{bits:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _known_state(batch: list[_Op]) -> ProviderState | None:
    """The state the batch's claims may be decided on without reading it; None: read.

    Only when every claim in the batch brought one and none must be decided afresh.
    The newest submission's copy is used: it was taken last.
    """
    claims = [op for op in batch if op.kind is _CLAIM]
    if not claims or any(op.known_state is None or op.reread or op.fresh_state
                         for op in claims):
        return None
    return claims[-1].known_state
