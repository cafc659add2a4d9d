"""The provider view: fresh shared state, read cheaply.

Every placement needs the provider-state and ticket documents of every provider. Two
ways keep them current:

* **Reading** (the default): a short cache (``state_cache_seconds``, 200 ms by default)
  absorbs bursts when one agent fans out many calls at once; after it, every document
  is read again.
* **Following** (:meth:`ProviderView.follow`): the view watches both buckets and
  parses only the documents that changed, so a fleet of a thousand cards costs per
  change, not per placement. A change is seen as soon as the watch delivers it, which
  is fresher than any cache window. When the watch cannot be set up or ends, the view
  falls back to reading.

This process's own claims and releases are applied to the documents at once (a refused
claim or an eviction drops the provider's entry for a re-read), so its own decisions
always see its own tickets; a watch delivery older than the write a note stands for is
not applied over it. Only providers whose documents, latency or circuit changed
are rebuilt; the rest of the :class:`FleetIndex` is shared with the previous snapshot.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from operator import is_
from typing import Generic, TypeVar

from kubemoot.clock import Clock
from kubemoot.runtime import faults
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.runtime.freshness import stale_at, stale_view
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.snapshot import (
    FleetIndex,
    FleetSnapshot,
    ProviderSnapshot,
    live_state,
    next_expiry,
)
from kubemoot.runtime.watching import Followers, ParsedDocuments
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import ProviderState, ProviderTickets, Ticket
from kubemoot.store.keys import decode_token, encode_token
from kubemoot.store.protocol import Bucket, Change, HandingWatch, StoreError, Watch

log = logging.getLogger(__name__)

_LOG_LENGTH = 4096  # index changes remembered for changed_since


class _Skip:
    """A parse that found an older revision than the one already held."""


_SKIP = _Skip()


_T = TypeVar("_T")


class _ParsedOnce(Generic[_T]):
    """Documents by key, each parsed once per revision; an older revision is skipped."""

    def __init__(self, parse: Callable[[str, int, bytes | None], _T | None]) -> None:
        self._parse = parse
        self._held: dict[str, tuple[int, _T | None]] = {}

    def of(self, key: str, revision: int, value: bytes | None) -> _T | _Skip | None:
        held = self._held.get(key)
        if held is not None and held[0] == revision:
            return held[1]
        if held is not None and held[0] > revision:
            return _SKIP  # an older version than the one we hold
        document = self._parse(key, revision, value)
        self._held[key] = (revision, document)
        return document

    def known(self, key: str) -> _T | None:
        """The newest document parsed for ``key`` (None: none, or it did not parse)."""
        held = self._held.get(key)
        return held[1] if held is not None else None

    def prime(self, key: str, revision: int, document: _T) -> None:
        """Hold ``document`` as revision ``revision`` of ``key`` without parsing it (its
        writer has it in hand); an older revision is not held over a newer one."""
        held = self._held.get(key)
        if held is None or held[0] < revision:
            self._held[key] = (revision, document)


class _Noted:
    """A provider's tickets as this process's own claim or release left them.

    Only the ticket list is read off a ticket document here, so that is all this
    holds: a pydantic document built for each claim and release cost more than the
    rest of noting it (the list's tickets are documents already).
    """

    __slots__ = ("tickets",)

    def __init__(self, tickets: list[Ticket]) -> None:
        self.tickets = tickets

    def active(self, now: float) -> list[Ticket]:
        """Tickets not yet expired (as :meth:`ProviderTickets.active`)."""
        return [t for t in self.tickets if t.expires_at > now]


#: A provider's ticket document as read or delivered, or as this process noted it.
_Tickets = ProviderTickets | _Noted


@dataclass(slots=True)
class _Built:
    """The snapshot made of one provider's documents, and what it depends on."""

    state: ProviderState
    tickets: _Tickets | None
    latency: float
    circuit_open: bool
    unreadable: bool  # its ticket document did not parse
    valid_until: float  # the first of its tickets to lapse
    snapshot: ProviderSnapshot
    shadowed: str | None = None  # the provider whose state stands in for a provisional one


class ProviderView:
    """Builds :class:`FleetSnapshot` values from the shared state."""

    def __init__(
        self,
        states: Bucket,
        tickets: Bucket,
        *,
        clock: Clock,
        settings: RuntimeSettings,
        latency: LatencyTracker,
        circuits: CircuitBreakers | None = None,
        ticket_documents: ParsedDocuments[ProviderTickets] | None = None,
    ) -> None:
        self._states, self._tickets = states, tickets
        #: The ticket documents, parsed once per revision (shared with the capacity watch).
        self._ticket_documents = ticket_documents or ParsedDocuments(ProviderTickets.from_json)
        self.clock = clock
        self._settings = settings
        #: Each endpoint's call latency (the queue price), fed by finished calls.
        self.latency = latency
        #: The providers' circuit breakers, when calls report their faults.
        self.circuits = circuits
        self._read_at = float("-inf")
        self._stale: set[str] = set()
        self._keys: list[str] | None = None
        self._listed_at = float("-inf")
        self._states_parsed = _ParsedOnce(self._parse_state)
        self._tickets_parsed = _ParsedOnce(self._parse_tickets)
        self._docs: dict[str, tuple[ProviderState, _Tickets | None]] = {}
        # What the current index was built from, and which providers must be rebuilt.
        self._built: dict[str, _Built] = {}
        self._index: FleetIndex | None = None
        self._dirty: set[str] = set()
        self._lapses: list[tuple[float, str]] = []  # (a ticket lapses, provider)
        self._latency_revision = -1
        self._open: set[str] = set()  # providers last built with an open circuit
        # providers whose state is provisional (an agent's direct probe): rebuilt with
        # every change, since another provider's state may shadow them (_shadowing)
        self._provisional: set[str] = set()
        # Providers whose ticket document does not parse: their memory is not known to
        # be free, so they are shown not ready until a readable version arrives.
        self._unreadable: set[str] = set()
        # Per provider, the newest ticket-document revision known when this process
        # last noted its own claim or release: the write it noted (the ticket manager
        # primes each write into the shared parse cache) or a newer one a follower
        # parsed. A watch delivery older than that predates the note; applied over it,
        # it showed a released call as still running, or hid a new ticket, until the
        # next delivery. Each such revision exists in the store, so the watch delivers
        # it or a later one: skipping what is older loses nothing.
        self._noted_floor: dict[str, int] = {}
        # Following: the watches and the changes they delivered but nobody applied yet.
        self._followers = Followers("view-watch", "provider-view")
        self._pending: dict[tuple[str, str], Change] = {}
        self._following = False
        # Which providers each new index changed: (from generation, to generation, names;
        # None names = everything was rebuilt). Bounded: a reader too far behind is told
        # that everything may have changed.
        self._log: deque[tuple[int, int, frozenset[str] | None]] = deque(maxlen=_LOG_LENGTH)

    @property
    def following(self) -> bool:
        """Whether watches keep the documents current (no re-reads needed)."""
        return self._following

    @property
    def generation(self) -> int:
        """The number of the fleet index the last snapshot used (0 before any)."""
        return self._index.generation if self._index is not None else 0

    @property
    def has_providers(self) -> bool:
        """Whether a snapshot taken now would show some provider, known without taking it.

        True only when the documents in hand hold a provider's state and are current: no
        watched change of a state document waits to be applied, and, when reading, the
        last read is within the state cache. False means "not known": take a snapshot.
        (A caller that needs only this, such as the gateway's check of a model it has
        already seen, skips the rebuild every call's own ticket makes due.)
        """
        if not self._docs:
            return False
        if self._following and self._read_at > float("-inf"):
            states = self._states.name
            return not any(bucket == states for bucket, _ in self._pending)
        return self.clock.now() - self._read_at < self._settings.state_cache_seconds

    def changed_since(self, generation: int) -> frozenset[str] | None:
        """Providers whose snapshot changed after ``generation``; None: unknown (all)."""
        if self._index is None or generation == self._index.generation:
            return frozenset()
        names: set[str] = set()
        for parent, new, changed in reversed(self._log):
            if new <= generation:
                break
            if changed is None:
                return None
            names.update(changed)
            if parent == generation:
                return frozenset(names)
        return None  # the log does not reach back that far

    # -- following -------------------------------------------------------------------

    async def follow(self) -> bool:
        """Keep the documents current from watches; False when the store cannot watch."""
        if self._following:
            return True
        try:
            await self._followers.open((self._states, self._tickets))
        except StoreError as error:
            faults.noted("view-watch", faults.STORE,
                         "provider view cannot watch; it reads instead", error)
            return False
        self._followers.start(self._follow)
        self._following = True
        self.invalidate()  # one full read after the watches began: nothing is missed
        return True

    async def _follow(self, watch: Watch) -> None:
        try:
            # Where the store hands changes over as they arrive (NATS), this task
            # wakes only for the watch's end, not once per change: on a busy fleet
            # every call's claim and release comes back here.
            if isinstance(watch, HandingWatch) and watch.hand_over(self._file):
                async for _ in watch:  # only the end comes this way
                    pass
            else:
                async for change in watch:
                    self._pending[(change.bucket, change.key)] = change
        except StoreError as error:
            faults.noted("view-watch", faults.STORE,
                         "provider view watch failed; it reads instead", error)
        finally:
            if self._following:
                self._following = False
                self.invalidate()  # back to reading, starting with everything

    def _file(self, change: Change) -> None:
        """Keep a delivered change until the next snapshot (the newest per document)."""
        self._pending[(change.bucket, change.key)] = change

    async def close(self) -> None:
        """Stop following (the view keeps working by reading)."""
        self._following = False
        await self._followers.close()

    def _apply_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for (bucket, key), change in pending.items():
            name = _decode(key)
            if name is None:
                continue
            if bucket == self._states.name:
                state = self._states_parsed.of(key, change.revision, change.value)
                if isinstance(state, _Skip):
                    continue
                if state is None:
                    if self._docs.pop(name, None) is not None:
                        self._dirty.add(name)
                    continue
                current = self._docs.get(name)
                self._docs[name] = (state, current[1] if current is not None else
                                    self._tickets_parsed.known(key))
            else:
                floor = self._noted_floor
                if name in floor and change.revision < floor[name]:
                    continue  # predates what this process noted: a newer one is coming
                doc = self._tickets_parsed.of(key, change.revision, change.value)
                if isinstance(doc, _Skip):
                    continue
                current = self._docs.get(name)
                if current is None:
                    continue  # tickets of a provider without state: kept for later
                self._docs[name] = (current[0], doc)
            self._dirty.add(name)

    # -- own changes -----------------------------------------------------------------

    def invalidate(self, provider: str | None = None) -> None:
        """Forget cached state: of one provider (after an own claim or unload), or of all."""
        if provider is None:
            self._read_at = float("-inf")
            self._keys = None
        else:
            self._stale.add(provider)

    def note_claimed(self, provider: str, ticket: Ticket) -> None:
        """This process's claim succeeded: show its ticket without a re-read."""
        current = self._docs.get(provider)
        if current is None or provider in self._stale:
            self.invalidate(provider)
            return
        state, doc = current
        kept = [] if doc is None else [t for t in doc.tickets if t.ticket_id != ticket.ticket_id]
        kept.append(ticket)
        self._docs[provider] = (state, _Noted(kept))
        self._noted_floor[provider] = self._ticket_documents.revision(encode_token(provider))
        self._dirty.add(provider)

    def note_released(self, provider: str, ticket_id: str) -> None:
        """This process released a ticket: drop it without a re-read."""
        current = self._docs.get(provider)
        if current is None:
            return
        state, doc = current
        if doc is None:
            return
        kept = [t for t in doc.tickets if t.ticket_id != ticket_id]
        self._docs[provider] = (state, _Noted(kept))
        self._noted_floor[provider] = self._ticket_documents.revision(encode_token(provider))
        self._dirty.add(provider)

    def note_state_written(self, revision: int, state: ProviderState) -> None:
        """This process wrote ``state`` as revision ``revision`` of its provider's state
        document: whenever the view meets that revision it takes the document as written
        instead of parsing the bytes back. (The simulator plays the prober in the same
        process and publishes a state after every change of a card's copies: fleet-16
        parsed about 760 a run.) The document must be what the written bytes parse to,
        and nobody may change it afterwards: the view keeps it."""
        self._states_parsed.prime(encode_token(state.provider), revision, state)

    def observe_latency(self, provider: str, endpoint: str, seconds: float) -> None:
        """Fold a finished call into the endpoint's latency, and rebuild only its provider."""
        in_step = self.latency.revision == self._latency_revision
        self.latency.observe(endpoint, seconds)
        if in_step:
            self._latency_revision = self.latency.revision
        self._dirty.add(provider)

    # -- snapshots -------------------------------------------------------------------

    async def snapshot(self) -> FleetSnapshot:
        """The fleet now; only what changed since the last snapshot is rebuilt."""
        now = self.clock.now()
        if self._following and self._read_at > float("-inf"):
            self._apply_pending()
            if self._stale:
                for provider in sorted(self._stale):
                    await self._read_provider(provider)
                self._stale.clear()
        elif now - self._read_at >= self._settings.state_cache_seconds:
            await self._read_all()
            self._read_at = now
            self._stale.clear()
        elif self._stale:
            for provider in sorted(self._stale):
                await self._read_provider(provider)
            self._stale.clear()
        return FleetSnapshot(now, self._current_index(now))

    def _current_index(self, now: float) -> FleetIndex:
        dirty = self._dirty
        self._dirty = set()
        lapses = self._lapses
        while lapses and lapses[0][0] <= now:
            at, name = heapq.heappop(lapses)
            held = self._built.get(name)
            # an entry of a snapshot since replaced lapses nothing: its successor has
            # an entry of its own (a rebuild would find the cached snapshot still good)
            if held is not None and held.valid_until == at:
                dirty.add(name)
        if self.latency.revision != self._latency_revision:
            dirty.update(self._docs)  # someone else fed the tracker: look at every provider
            self._latency_revision = self.latency.revision
        if self.circuits is not None:
            for name in self.circuits.tracked() | self._open:
                if name in self._docs and (not self.circuits.allows(name)) != (
                    name in self._open
                ):
                    dirty.add(name)
        if dirty and self._provisional:
            dirty |= self._provisional  # a state that came or went may (un)shadow them
        if self._index is not None and not dirty:
            return self._index
        changed: list[ProviderSnapshot] = []
        removed: list[str] = []
        relatencied = True  # every change is of latency alone (ProviderSnapshot.with_latency)
        for name in sorted(dirty):
            docs = self._docs.get(name)
            if docs is None:
                if self._built.pop(name, None) is not None:
                    removed.append(name)
                self._open.discard(name)
                self._provisional.discard(name)
                continue
            built = self._build(docs[0], docs[1], now)
            if built is not None:
                changed.append(built[0])
                relatencied = relatencied and built[1]
        if self._index is None:
            self._index = FleetIndex.build(b.snapshot for b in self._built.values())
            self._log.append((0, self._index.generation, None))
        elif changed or removed:
            parent = self._index.generation
            if relatencied and not removed:
                self._index = self._index.with_latencies(changed)
            else:
                self._index = self._index.replaced(changed, removed)
            self._log.append((parent, self._index.generation,
                              frozenset([*(p.name for p in changed), *removed])))
        return self._index

    def _build(
        self, state: ProviderState, tickets: _Tickets | None, now: float
    ) -> tuple[ProviderSnapshot, bool] | None:
        """The provider's snapshot, and whether it differs from the one in the index in
        latency alone; ``None`` when the one in the index still holds."""
        name = state.provider
        circuit_open = self.circuits is not None and not self.circuits.allows(name)
        latency = self.latency.latency(state.endpoint)
        unreadable = name in self._unreadable
        shadowed = None
        if state.provisional:
            self._provisional.add(name)
            shadowed = self._shadowing(state)
        else:
            self._provisional.discard(name)
        cached = self._built.get(name)
        active = None
        if (
            cached is not None
            and cached.state is state
            and (cached.circuit_open, cached.unreadable, cached.shadowed)
            == (circuit_open, unreadable, shadowed)
            and now < cached.valid_until
        ):
            if cached.tickets is tickets:
                same = True
            else:
                active = tuple(tickets.active(now)) if tickets is not None else ()
                before = cached.snapshot.tickets
                if cached.latency == latency:
                    same = active == before
                else:
                    # Only the very same tickets (no field compared): when the tickets
                    # differ the provider is built anew, and comparing them field by
                    # field first cost the simulator more than the patch saved it.
                    same = len(active) == len(before) and all(map(is_, active, before))
            if same:
                # The same documents, or another ticket document with the same live
                # tickets (a call claimed and released between two snapshots leaves its
                # provider as it was), and no ticket lapsed since: the snapshot, its
                # lapse time and the index stay as they are.
                cached.tickets = tickets
                if cached.latency == latency:
                    return None
                # Only the latency moved, as it does after every finished call: what
                # the snapshot and the index derived from the documents still holds.
                cached.latency = latency
                cached.snapshot = cached.snapshot.with_latency(latency)
                return cached.snapshot, True
        if active is None:
            active = tuple(tickets.active(now)) if tickets is not None else ()
        # a copy at or past its keep-alive's end is not warm, unless a call runs on it
        shown = live_state(state, now, {t.model for t in active})
        if unreadable:  # never free memory: nothing is placed there until it reads again
            shown = state.model_copy(
                update={"ready": False, "reason": "its ticket document is unreadable"}
            )
        elif shadowed is not None:
            # One card under two names: the stand-in's copies look idle (no ticket of the
            # real provider's is on it), so a warm call would take a slot twice over.
            shown = state.model_copy(
                update={"ready": False, "reason": f"provider {shadowed} serves its endpoint"}
            )
        # (a state that promises no probe interval is never stale: not even a call then)
        stale = (None if state.probe_interval_seconds is None
                 else stale_at(state, self._settings))
        if stale is not None and now >= stale:
            # Nobody refreshes it: what it says is no evidence (runtime.freshness).
            shown = stale_view(shown, now, self._settings)
            stale = None
        snapshot = ProviderSnapshot(
            state=shown, tickets=active, latency_seconds=latency, circuit_open=circuit_open
        )
        if cached is not None:  # most rebuilds follow a ticket change: the state is the same
            snapshot.sharing_residency(cached.snapshot)
        valid_until = min((t.expires_at for t in active), default=float("inf"))
        if (expiry := next_expiry(shown)) is not None:  # rebuilt when a copy lapses
            valid_until = min(valid_until, expiry)
        if stale is not None:  # and when its state turns stale
            valid_until = min(valid_until, stale)
        if valid_until != float("inf"):
            heapq.heappush(self._lapses, (valid_until, name))
        self._built[name] = _Built(state, tickets, latency, circuit_open, unreadable,
                                   valid_until, snapshot, shadowed)
        if circuit_open:
            self._open.add(name)
        else:
            self._open.discard(name)
        return snapshot, False

    def _shadowing(self, state: ProviderState) -> str | None:
        """The provider with a state of its own (not provisional) at ``state``'s
        endpoint, which ``state`` only stood in for (None: none). An agent's direct probe
        publishes a provisional state until the operator's arrives and withdraws it on
        its next tick; in between, the same card would be offered twice."""
        endpoint = state.endpoint.rstrip("/")
        for other, _ in self._docs.values():
            if not other.provisional and other.endpoint.rstrip("/") == endpoint:
                return other.provider
        return None

    # -- reading ---------------------------------------------------------------------

    async def _read_all(self) -> None:
        # Reads go out together: on a networked store one refresh costs about one round
        # trip per bucket, not one per provider.
        now = self.clock.now()
        if self._keys is None or now - self._listed_at >= self._settings.discovery_seconds:
            self._keys = sorted(await self._states.keys())
            self._listed_at = now
        keys = self._keys
        states = await asyncio.gather(*(self._state(k) for k in keys))
        present = [s for s in states if s is not None]
        tickets = await asyncio.gather(
            *(self._tickets_doc(encode_token(s.provider)) for s in present)
        )
        docs: dict[str, tuple[ProviderState, _Tickets | None]] = {
            s.provider: (s, t) for s, t in zip(present, tickets, strict=True)
        }
        for name in set(self._docs) | set(docs):
            old, new = self._docs.get(name), docs.get(name)
            if old is None or new is None or old[0] is not new[0] or old[1] is not new[1]:
                self._dirty.add(name)
        self._docs = docs

    async def _read_provider(self, provider: str) -> None:
        key = encode_token(provider)
        state, tickets = await asyncio.gather(self._state(key), self._tickets_doc(key))
        if state is None:
            self._docs.pop(provider, None)
        else:
            self._docs[provider] = (state, tickets)
        self._dirty.add(provider)

    async def _state(self, key: str) -> ProviderState | None:
        entry = await self._states.get(key)
        if entry is None:
            return None
        parsed = self._states_parsed.of(key, entry.revision, entry.value)
        if isinstance(parsed, _Skip):  # a newer version arrived through the watch already
            return self._states_parsed.known(key)
        return parsed

    async def _tickets_doc(self, key: str) -> ProviderTickets | None:
        entry = await self._tickets.get(key)
        if entry is None:
            return None
        parsed = self._tickets_parsed.of(key, entry.revision, entry.value)
        if isinstance(parsed, _Skip):
            return self._tickets_parsed.known(key)
        return parsed

    # -- parsing, once per revision ---------------------------------------------------

    def _parse_state(self, key: str, revision: int, value: bytes | None) -> ProviderState | None:
        if value is None:
            return None
        try:
            state = ProviderState.from_json(value)
        except ValueError as error:
            # Without a readable state there is no endpoint to send a call to; the
            # provider is left out, and the log and the count say why.
            faults.noted("provider-state", faults.UNREADABLE,
                         f"provider state {key} unreadable; provider left out", error)
            return None
        if state.provider != _decode(key):
            faults.noted("provider-state", faults.UNREADABLE,
                         f"provider state {key} left out",
                         ValueError(f"it names provider {state.provider!r}"))
            return None
        return state

    def _parse_tickets(
        self, key: str, revision: int, value: bytes | None
    ) -> ProviderTickets | None:
        doc: ProviderTickets | None = None
        unreadable = False
        if value is not None:
            try:
                doc = self._ticket_documents.of(key, revision, value)
            except ValueError as error:
                unreadable = True
                faults.noted("tickets", faults.UNREADABLE,
                             f"ticket document {key} unreadable; its provider is shown "
                             "not ready", error)
        name = _decode(key)
        if name is not None and unreadable != (name in self._unreadable):
            if unreadable:
                self._unreadable.add(name)
            else:
                self._unreadable.discard(name)
            self._dirty.add(name)
        return doc


def _decode(key: str) -> str | None:
    try:
        return decode_token(key)
    except ValueError:
        return None
