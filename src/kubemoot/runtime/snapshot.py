"""What one placement decision looks at: a frozen picture of the fleet.

The pure cost, filter and eviction code works only on these values, so it can be
tested, benchmarked and simulated without a store, a clock or a network.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from kubemoot.frozen import quick_init
from kubemoot.settings import DEFAULTS
from kubemoot.store.documents import ProviderState, ResidentModel, Ticket, TicketState

#: How far ahead a copy's engine expiry already counts as passed. A warm call reaches
#: the engine a moment after it is placed; a copy whose keep-alive ends within that
#: moment may be gone when it arrives, and the engine would then reload it with memory
#: no ticket holds (DESIGN §5, residency is a lease with an end).
EXPIRY_MARGIN_SECONDS = 1.0

#: How long after its keep-alive ends a copy's memory still counts: the engine frees it
#: when its unload, started by the expiry, is done (the runtime's default unload time).
UNLOAD_GRACE_SECONDS = DEFAULTS.unload_seconds


class LapsingCopy(ResidentModel):
    """A copy the engine still holds, but too close to (or past) its keep-alive's end
    to be warm: see :func:`live_state`. Only :func:`live_state` makes these."""


def live_state(state: ProviderState, now: float,
               busy: Collection[str] = ()) -> ProviderState:
    """``state`` as a call placed at ``now`` finds it; the same object when no copy's
    keep-alive ends within :data:`EXPIRY_MARGIN_SECONDS`.

    A copy whose keep-alive ends within the margin, or ended less than
    :data:`UNLOAD_GRACE_SECONDS` ago, is *lapsing* (a :class:`LapsingCopy`): it is not
    warm, since the engine may unload it before a call placed on it arrives, but its
    memory is still the engine's until the unload that the expiry starts is done, so it
    counts as resident memory (DESIGN §5: resident is what the engine holds), and it may
    be planned as an eviction victim: unloading it only frees that memory sooner, as the
    engine's own expiry would. Freeing it at once let a load be placed into memory the
    engine still held, and the engine made room by evicting the copy on its own. A copy
    whose unload is done by now is dropped. A copy in ``busy`` (a call holds a ticket
    on it) stays warm: the engine never unloads a copy a request uses, and renews its
    keep-alive when the request ends.
    """
    horizon = now + EXPIRY_MARGIN_SECONDS
    gone = now - UNLOAD_GRACE_SECONDS
    kept: list[ResidentModel] = []
    changed = False
    for m in state.loaded_models:
        ends = m.expires_at
        if ends is None or ends > horizon or m.name in busy:
            kept.append(m)
            continue
        changed = True
        if ends > gone:
            kept.append(m if isinstance(m, LapsingCopy)
                        else LapsingCopy.model_construct(**m.__dict__))
    if not changed:
        return state
    return state.model_copy(update={"loaded_models": kept})


def next_expiry(state: ProviderState) -> float | None:
    """When a copy in ``state`` (a :func:`live_state`) next changes what it counts as:
    a warm copy becomes lapsing, a lapsing copy's memory comes back (None: never)."""
    # Each copy's expiry is read once, and its class by type(): a pydantic model's
    # attribute reads (``__class__`` too, which isinstance() reads when the class
    # differs) go through the slot hook its __getattr__ puts on the class.
    # LapsingCopy has no subclass, so type() answers as isinstance() would.
    ends = [at + UNLOAD_GRACE_SECONDS if type(m) is LapsingCopy
            else at - EXPIRY_MARGIN_SECONDS
            for m in state.loaded_models if (at := m.expires_at) is not None]
    return min(ends) if ends else None


_UNSET: object = object()
# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read, a module global about 150): these are
# compared once per ticket of a snapshot.
_LOADING, _HELD = TicketState.LOADING, TicketState.HELD


class ProviderSnapshot:
    """One provider: its published state, its live tickets, its latency and circuit.

    This is the one home of a provider's memory arithmetic (DESIGN §5)::

        usable   = totalVram − reserve
        resident = Σ footprints the engine reports loaded (warm or lapsing copies)
        loading  = Σ footprints of tickets whose model is not resident yet
        free     = usable − resident − loading

    The pricing reads it from the view's snapshots, the ticket budget from a snapshot
    of the documents a claim is deciding on (:meth:`of_documents`), so both agree.

    A value: equal when its four inputs are, and never changed after it is made. What
    is derived from the inputs is worked out on first use, in three groups (residency,
    budget, per-model calls), because most snapshots answer few questions: a claim asks
    only for its headroom and ceiling, and most snapshots of a fleet are never looked at
    before the next change replaces them.
    """

    __slots__ = (
        "_budget",
        "_calls",
        "_free",
        "_residency",
        "circuit_open",
        "latency_seconds",
        "name",
        "slots",
        "state",
        "tickets",
        "usable_mib",
    )

    state: ProviderState
    tickets: tuple[Ticket, ...]  # active (unexpired) at the snapshot's time
    latency_seconds: float
    circuit_open: bool
    #: ``totalVram − reserve``; ``None`` when the total is unknown.
    usable_mib: int | None
    #: Calls the provider serves at once per model (at least one).
    slots: int
    #: The provider's name (a placement reads it for every copy it looks at).
    name: str
    _residency: _Residency | None
    _budget: _Budget | None
    _calls: _Calls | None
    #: its entries in the index's free copies (see :meth:`_FreeCopies._entries`)
    _free: frozenset[tuple[str, int, int]] | None

    def __init__(
        self,
        state: ProviderState,
        tickets: tuple[Ticket, ...] = (),
        latency_seconds: float = DEFAULTS.default_latency_seconds,
        circuit_open: bool = False,
    ) -> None:
        put = object.__setattr__
        put(self, "state", state)
        put(self, "tickets", tickets)
        put(self, "latency_seconds", latency_seconds)
        put(self, "circuit_open", circuit_open)
        total = state.total_vram_mib
        put(self, "usable_mib", None if total is None else total - state.reserve_mib)
        put(self, "slots", max(1, state.max_parallel))
        put(self, "name", state.provider)
        put(self, "_residency", None)
        put(self, "_budget", None)
        put(self, "_calls", None)
        put(self, "_free", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ProviderSnapshot is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ProviderSnapshot is immutable; cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, ProviderSnapshot)
        return (self.state, self.tickets, self.latency_seconds, self.circuit_open) == (
            other.state, other.tickets, other.latency_seconds, other.circuit_open
        )

    __hash__ = None  # type: ignore[assignment]  # its state is a mutable document

    def __repr__(self) -> str:
        return (f"ProviderSnapshot(state={self.state!r}, tickets={self.tickets!r}, "
                f"latency_seconds={self.latency_seconds!r}, "
                f"circuit_open={self.circuit_open!r})")

    # -- derived, on first use --------------------------------------------------------

    def sharing_residency(self, earlier: ProviderSnapshot) -> ProviderSnapshot:
        """This snapshot, told what ``earlier`` worked out of the same state document
        (only its tickets, latency or circuit differ): the residency is not derived
        again. Returns ``self``."""
        if earlier.state is self.state and self._residency is None:
            object.__setattr__(self, "_residency", earlier._residency)
        return self

    def with_latency(self, latency_seconds: float) -> ProviderSnapshot:
        """This provider with another call latency, all else the same. Nothing derived
        here depends on the latency (memory, slots, calls in flight, the index's
        free-copy entries), so it is carried over instead of worked out again: every
        finished call moves its endpoint's latency, and a provider rebuilt for that
        alone cost a warm call most of its placement's snapshot work."""
        new = object.__new__(ProviderSnapshot)
        put = object.__setattr__
        put(new, "state", self.state)
        put(new, "tickets", self.tickets)
        put(new, "latency_seconds", latency_seconds)
        put(new, "circuit_open", self.circuit_open)
        put(new, "usable_mib", self.usable_mib)
        put(new, "slots", self.slots)
        put(new, "name", self.name)
        put(new, "_residency", self._residency)
        put(new, "_budget", self._budget)
        put(new, "_calls", self._calls)
        put(new, "_free", self._free)
        return new

    # Readers below write ``self._residency or self._resident()``: most questions find
    # the group derived already, and a method call per question is most of their cost.
    def _resident(self) -> _Residency:
        found = self._residency
        if found is None:
            found = _Residency.of(self.state)
            object.__setattr__(self, "_residency", found)
        return found

    def _budgeted(self) -> _Budget:
        found = self._budget
        if found is None:
            found = _Budget.of(self.tickets, (self._residency or self._resident()).footprints)
            object.__setattr__(self, "_budget", found)
        return found

    def _per_model(self) -> _Calls:
        found = self._calls
        if found is None:
            found = _Calls.of(self.tickets, (self._residency or self._resident()).footprints)
            object.__setattr__(self, "_calls", found)
        return found

    @property
    def resident_total(self) -> int:
        """Σ footprints of the copies the engine holds (lapsing ones too), in MiB."""
        return (self._residency or self._resident()).total

    @property
    def loading_mib(self) -> int:
        """Σ footprints of tickets whose model is not resident yet: copies still loading."""
        return (self._budget or self._budgeted()).loading_mib

    @property
    def free_mib(self) -> int | None:
        """``usable − resident − loading``; ``None`` when the total is unknown."""
        usable = self.usable_mib
        if usable is None:
            return None
        resident = (self._residency or self._resident()).total
        return usable - resident - (self._budget or self._budgeted()).loading_mib

    @classmethod
    def of_documents(
        cls, state: ProviderState | None, tickets: Iterable[Ticket], now: float
    ) -> ProviderSnapshot | None:
        """The provider as a claim sees it: its documents, tickets active at ``now``,
        its copies as :func:`live_state` counts them at ``now``."""
        if state is None:
            return None
        active = tuple(t for t in tickets if t.expires_at > now)
        return cls(state=live_state(state, now, {t.model for t in active}), tickets=active)

    @property
    def residents(self) -> dict[str, int]:
        """Models the engine reports loaded, with their footprints in MiB: the warm
        copies and the lapsing ones (memory it still holds, a victim it may unload)."""
        return dict((self._residency or self._resident()).held)

    def holds(self, model: str) -> bool:
        """The engine holds a copy of ``model`` here, warm or lapsing: one of
        :attr:`residents`. :meth:`is_resident` asks whether it is warm."""
        return model in (self._residency or self._resident()).held

    @property
    def copies(self) -> frozenset[str]:
        """Models resident here or being loaded here by a ticket."""
        return (self._budget or self._budgeted()).copies

    def credit_mib(self, victims: Iterable[str]) -> int:
        """Memory the distinct ``victims`` free, counting only those still held."""
        residents = (self._residency or self._resident()).held
        return sum(residents[v] for v in set(victims) if v in residents)

    def headroom_mib(self, evicts: Iterable[str] = (), model: str | None = None) -> int | None:
        """What a new ticket planning ``evicts`` may still spend; ``None``: total unknown.

        ``free`` plus each distinct victim planned here (by a live ticket or by the new
        one) once, while it is still resident: two plans that pick the same victim share
        its memory, and a victim already unloaded shows up as lower residency instead.
        A ticket for ``model`` also gets the memory of that model's lapsing copy
        (:meth:`lapsing_mib`).
        """
        free = self.free_mib
        if free is None:
            return None
        victims = (self._budget or self._budgeted()).victims | set(evicts)
        return free + self.credit_mib(victims) + self.lapsing_mib(model)

    def ceiling_mib(self, evicts: Iterable[str] = (), model: str | None = None) -> int | None:
        """What a ticket planning ``evicts`` could ever get here, were every ticket gone."""
        usable = self.usable_mib
        if usable is None:
            return None
        return usable - self.resident_total + self.credit_mib(evicts) + self.lapsing_mib(model)

    def lapsing_mib(self, model: str | None) -> int:
        """The memory of ``model``'s lapsing copy here (0: none), which a load of that
        same model may count as its own: the engine serves such a call on the copy while
        it still has it, and otherwise reloads it once the copy's unload has freed its
        memory, never holding both. A ticket's claim keeps the copy warm (a call on it),
        so from then on the copy's memory is the ticket's and nothing is counted twice.
        A lapsing copy some live ticket plans to unload gives none: that plan has it."""
        if model is None:
            return 0
        found = self._residency or self._resident()
        own = found.held.get(model, 0) - found.footprints.get(model, 0)
        if own and model in (self._budget or self._budgeted()).victims:
            return 0
        return own

    def has_free_slot(self, model: str, *, ahead: int = 0) -> bool:
        """A slot on the copy of ``model`` is free once ``ahead`` earlier calls took theirs."""
        return len((self._calls or self._per_model()).in_flight.get(model, ())) + ahead < self.slots

    def is_resident(self, model: str) -> bool:
        """A warm copy of ``model`` is here (not a lapsing one: see :func:`live_state`)."""
        return model in (self._residency or self._resident()).footprints

    def planned_victims(self) -> frozenset[str]:
        """Models some active ticket here plans to unload."""
        return (self._budget or self._budgeted()).victims

    def in_flight(self, model: str) -> tuple[Ticket, ...]:
        """Calls running (or waiting for their load) on this provider's copy of ``model``.

        A held plan is not a call yet, so it takes no slot.
        """
        return (self._calls or self._per_model()).in_flight.get(model, ())

    def first_call_started(self, model: str) -> float | None:
        """When the earliest call in flight on the copy of ``model`` was claimed."""
        return (self._calls or self._per_model()).first_call.get(model)

    def load_started(self, model: str) -> float | None:
        """When a ticket began loading the copy of ``model``; None when none is loading."""
        return (self._calls or self._per_model()).load_started.get(model)

    def load_mib(self, model: str) -> int | None:
        """The footprint the ticket loading ``model`` here claimed; ``None`` when unknown.

        That is the size of *this* load, so it is what the load's remaining time is
        counted from. It is unknown for a copy whose loader claimed no footprint (a
        loading ticket written by hand without one, for a model nothing else sizes).
        """
        return (self._calls or self._per_model()).load_mib.get(model)

    def loading_tickets(self, model: str) -> list[Ticket]:
        """Tickets whose memory is a copy of ``model`` not yet reported resident."""
        if model in (self._residency or self._resident()).footprints:
            return []
        return _loaders((self._calls or self._per_model()).by_model.get(model, ()))

    def has_copy(self, model: str) -> bool:
        """Resident, or being loaded by a ticket."""
        return model in (self._budget or self._budgeted()).copies

    def context_for(self, model: str) -> int | None:
        """Context of (this provider, model): observed when loaded, else configured."""
        # The first loaded entry of the model that reports a context wins (derived once).
        context = (self._residency or self._resident()).contexts.get(model)
        return self.state.context_length if context is None else context


def _loaders(tickets: Iterable[Ticket]) -> list[Ticket]:
    """The tickets whose memory is a copy still loading, the first loader first.

    A ticket that claimed a footprint for a model the engine does not report yet is
    loading it. A ticket in state ``loading`` without a footprint is one too: its size
    is unknown, but the copy exists, and ignoring it would send the next call to load a
    second copy elsewhere. When both kinds exist, the footprint tickets come first: they
    are the loads whose size, and so whose end, is known.
    """
    sized = sorted(
        (t for t in tickets if t.model_footprint_mib > 0), key=lambda t: t.started_at
    )
    if sized:
        return sized
    return sorted(
        (t for t in tickets if t.state is _LOADING), key=lambda t: t.started_at
    )


class _Residency:
    """What the engine reports loaded: footprint and first known context per model, of
    the warm copies (``footprints``) and of every copy it holds (``held``: the warm ones
    and the lapsing ones, whose memory it has not freed yet)."""

    __slots__ = ("contexts", "footprints", "held", "total")

    def __init__(self, footprints: dict[str, int], contexts: dict[str, int],
                 held: dict[str, int] | None = None) -> None:
        self.footprints = footprints
        self.contexts = contexts
        self.held = footprints if held is None else held
        self.total = sum(self.held.values())

    @classmethod
    def of(cls, state: ProviderState) -> _Residency:
        footprints: dict[str, int] = {}
        contexts: dict[str, int] = {}
        lapsing: list[ResidentModel] = []
        for loaded in state.loaded_models:
            if type(loaded) is LapsingCopy:  # (as in next_expiry: no hooked __class__)
                lapsing.append(loaded)
                continue
            name = loaded.name  # each field read once (pydantic's hooked reads)
            footprints[name] = footprints.get(name, 0) + loaded.size_mib
            if (context := loaded.context_length) is not None:
                contexts.setdefault(name, context)
        if not lapsing:
            return cls(footprints, contexts)
        held = dict(footprints)
        for loaded in lapsing:
            held[loaded.name] = held.get(loaded.name, 0) + loaded.size_mib
        return cls(footprints, contexts, held)


class _Budget:
    """What a claim asks first: memory still loading, models planned for unload, and
    which models have a copy here (resident, or loading for a ticket)."""

    __slots__ = ("copies", "loading_mib", "victims")

    def __init__(self, loading_mib: int, victims: frozenset[str],
                 copies: frozenset[str]) -> None:
        self.loading_mib = loading_mib
        self.victims = victims
        self.copies = copies

    @classmethod
    def of(cls, tickets: tuple[Ticket, ...], residents: dict[str, int]) -> _Budget:
        loading_mib = 0
        loading: set[str] = set()
        victims: set[str] = set()
        for t in tickets:
            if evicts := t.evicts:  # (each field read once: pydantic's hooked reads)
                victims.update(evicts)
            model = t.model
            if model in residents:
                continue
            footprint = t.model_footprint_mib
            loading_mib += footprint
            # the same rule as _loaders: a sized ticket, or one in state loading
            if footprint > 0 or t.state is _LOADING:
                loading.add(model)
        return cls(loading_mib, frozenset(victims), frozenset(residents) | loading)


class _Calls:
    """Per model: its tickets, the calls in flight, and its loader."""

    __slots__ = ("by_model", "first_call", "in_flight", "load_mib", "load_started")

    def __init__(self, by_model: dict[str, list[Ticket]], residents: dict[str, int]) -> None:
        self.by_model = by_model
        loaders = {
            m: found for m, ts in by_model.items()
            if m not in residents and (found := _loaders(ts))
        }
        # Lists built by comprehension, not generators fed to tuple() and min(): a
        # generator is resumed once per ticket, and a busy provider's snapshot is built
        # again for every claim and release. (Grouping the tickets by model without the
        # loop in :meth:`of` saved calls but cost more instructions where a card holds
        # several models, as the simulator's do: kept.)
        in_flight = {
            m: calls for m, ts in by_model.items()
            if (calls := tuple([t for t in ts if t.state is not _HELD]))
        }
        self.in_flight: dict[str, tuple[Ticket, ...]] = in_flight
        self.first_call: dict[str, float] = {
            m: min([t.started_at for t in calls]) for m, calls in in_flight.items()
        }
        self.load_started: dict[str, float] = {m: ts[0].started_at for m, ts in loaders.items()}
        self.load_mib: dict[str, int] = {
            m: ts[0].model_footprint_mib for m, ts in loaders.items()
            if ts[0].model_footprint_mib > 0
        }

    @classmethod
    def of(cls, tickets: tuple[Ticket, ...], residents: dict[str, int]) -> _Calls:
        by_model: dict[str, list[Ticket]] = {}
        for t in tickets:
            by_model.setdefault(t.model, []).append(t)
        return cls(by_model, residents)


_GENERATIONS = itertools.count(1)


class FleetIndex:
    """Every provider, indexed the ways a placement looks them up.

    A placement must not walk the whole fleet for every candidate model: the copies of
    a model come from ``copies_of`` and cold-load room from ``with_room`` (a list sorted
    by free memory, so the tightest fit is found by bisection). An index is immutable;
    :meth:`replaced` derives the next one from a few changed providers without
    rebuilding the rest, so a fleet of a thousand cards stays cheap to keep current.
    """

    __slots__ = (
        "_by_name",
        "_copies",
        "_free",
        "_providers",
        "_room",
        "changed",
        "generation",
        "parent",
    )

    def __init__(
        self,
        by_name: dict[str, ProviderSnapshot],
        copies: dict[str, tuple[str, ...]],
        room: list[tuple[int, str]],
        free: _FreeCopies,
        *,
        parent: int | None = None,
        changed: tuple[ProviderSnapshot, ...] = (),
    ) -> None:
        self._by_name = by_name
        self._copies = copies
        self._room = room
        self._free = free
        self._providers: tuple[ProviderSnapshot, ...] | None = None
        #: A number of its own, the number of the index this one was derived from (not
        #: the index itself: a chain of them would keep every past fleet alive), and the
        #: providers new in this one.
        self.generation = next(_GENERATIONS)
        self.parent = parent
        self.changed = changed

    @classmethod
    def build(cls, providers: Iterable[ProviderSnapshot]) -> FleetIndex:
        by_name = {p.name: p for p in providers}
        copies: dict[str, list[str]] = {}
        room: list[tuple[int, str]] = []
        for name in sorted(by_name):
            p = by_name[name]
            for model in p.copies:
                copies.setdefault(model, []).append(name)
            free = p.free_mib
            if free is not None:
                room.append((free, name))
        room.sort()
        warm = _FreeCopies()
        for p in by_name.values():
            warm.put(p)
        return cls(by_name, {m: tuple(n) for m, n in copies.items()}, room, warm,
                   changed=tuple(by_name.values()))

    def replaced(
        self, changed: Iterable[ProviderSnapshot], removed: Iterable[str] = ()
    ) -> FleetIndex:
        """A new index with ``changed`` providers put in and ``removed`` ones taken out."""
        by_name = dict(self._by_name)
        copies = dict(self._copies)
        room = list(self._room)
        free = self._free.derived()
        new = list(changed)

        def drop_copy(model: str, name: str) -> None:
            # the names are sorted: find the one by bisection, not by a scan
            names = copies.get(model, ())
            at = bisect_left(names, name)
            if at < len(names) and names[at] == name:
                names = names[:at] + names[at + 1:]
            if names:
                copies[model] = names
            else:
                copies.pop(model, None)

        def add_copy(model: str, name: str) -> None:
            names = copies.get(model, ())
            at = bisect_left(names, name)
            copies[model] = (*names[:at], name, *names[at:])

        def drop_room(mib: int | None, name: str) -> None:
            if mib is not None:
                at = bisect_left(room, (mib, name))
                if at < len(room) and room[at] == (mib, name):
                    del room[at]

        for name in removed:
            old = by_name.pop(name, None)
            if old is not None:
                for model in old.copies:
                    drop_copy(model, old.name)
                free.take(old)
                drop_room(old.free_mib, old.name)
        for p in new:
            old = by_name.get(p.name)
            by_name[p.name] = p
            # Only what differs from the provider's previous snapshot moves: a claim or
            # release changes its tickets (and so its free memory and slots), rarely its
            # copies, and most models' lists stay shared with the parent index.
            old_copies = frozenset() if old is None else old.copies
            for model in old_copies - p.copies:
                drop_copy(model, p.name)
            for model in p.copies - old_copies:
                add_copy(model, p.name)
            if old is None:
                free.put(p)
            else:
                free.moved(old, p)
            mib = p.free_mib
            if old is None or old.free_mib != mib:
                if old is not None:
                    drop_room(old.free_mib, p.name)
                if mib is not None:
                    insort(room, (mib, p.name))
        return FleetIndex(by_name, copies, room, free, parent=self.generation,
                          changed=tuple(new))

    def with_latencies(self, changed: Iterable[ProviderSnapshot]) -> FleetIndex:
        """A new index with ``changed`` put in, each differing from the provider of its
        name only in latency (:meth:`ProviderSnapshot.with_latency`). No list of the
        index depends on the latency, so all are shared with this one: an index is
        never changed once made (:meth:`replaced` copies what it changes)."""
        by_name = dict(self._by_name)
        new = tuple(changed)
        for p in new:
            by_name[p.name] = p
        return FleetIndex(by_name, self._copies, self._room, self._free,
                          parent=self.generation, changed=new)

    @property
    def providers(self) -> tuple[ProviderSnapshot, ...]:
        """Every provider, by name."""
        if self._providers is None:
            self._providers = tuple(self._by_name[n] for n in sorted(self._by_name))
        return self._providers

    def provider(self, name: str) -> ProviderSnapshot | None:
        return self._by_name.get(name)

    def __len__(self) -> int:
        return len(self._by_name)

    def copies_of(self, model: str) -> list[ProviderSnapshot]:
        """Providers holding or loading a copy of ``model``, by name."""
        return [self._by_name[n] for n in self._copies.get(model, ())]

    def copy_count(self, model: str) -> int:
        """How many providers hold or load a copy of ``model``."""
        return len(self._copies.get(model, ()))

    def free_copies(self, model: str) -> list[tuple[int, str]]:
        """``(calls in flight, name)`` of the resident copies of ``model`` a call can
        share with a slot free, fewest calls in flight first (then by name): the warm
        case's order. Shared: do not change it."""
        return self._free.of(model)

    def smallest_free_context(self, model: str) -> int | None:
        """The smallest context among :meth:`free_copies` (``None``: none says)."""
        return self._free.smallest_context(model)

    def with_room(self, mib: int) -> Iterator[ProviderSnapshot]:
        """Providers with at least ``mib`` free, tightest fit first (then by name)."""
        for _free, name in self._room[bisect_left(self._room, (mib, "")):]:
            yield self._by_name[name]


class _FreeCopies:
    """Per model, the resident copies a call could take a free slot on, kept sorted.

    A call's first question in a big fleet is "which warm copy with a slot free has the
    fewest calls in flight": a model has a copy on hundreds of cards. The lists are
    kept up to date per changed provider like the room list, copied only for the
    models a change touches. Membership asks the warm gates' standing questions (ready,
    circuit closed, not planned for unload) and a free slot; the context is per call,
    so each list keeps its copies' contexts beside it, sorted, to judge a prompt at once.
    """

    __slots__ = ("_contexts", "_copies", "_owned")

    #: a copy whose context is not known stands in the list as holding any prompt
    UNBOUNDED = 1 << 62

    def __init__(
        self,
        copies: dict[str, list[tuple[int, str]]] | None = None,
        contexts: dict[str, list[tuple[int, str]]] | None = None,
    ) -> None:
        self._copies = copies if copies is not None else {}
        self._contexts = contexts if contexts is not None else {}
        #: models whose lists this instance made itself and may change in place
        self._owned: set[str] = set()

    def derived(self) -> _FreeCopies:
        return _FreeCopies(dict(self._copies), dict(self._contexts))

    @staticmethod
    def _entries(p: ProviderSnapshot) -> frozenset[tuple[str, int, int]]:
        """:meth:`_listed`, worked out once per snapshot (a snapshot never changes): an
        index that replaces a provider's snapshot asks for the old one's entries again
        (fleet-16: about 2,100 times a run)."""
        found = p._free
        if found is None:
            found = frozenset(_FreeCopies._listed(p))
            object.__setattr__(p, "_free", found)
        return found

    @staticmethod
    def _listed(p: ProviderSnapshot) -> Iterator[tuple[str, int, int]]:
        """``(model, calls in flight, context)`` for each copy of ``p`` that belongs."""
        if not p.state.ready or p.circuit_open:
            return
        victims = p.planned_victims()
        for model in p.copies:
            if not p.is_resident(model) or model in victims or not p.has_free_slot(model):
                continue
            context = p.context_for(model)
            yield (model, len(p.in_flight(model)),
                   _FreeCopies.UNBOUNDED if context is None else context)

    def _lists(self, model: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        if model not in self._owned:
            self._owned.add(model)
            self._copies[model] = list(self._copies.get(model, ()))
            self._contexts[model] = list(self._contexts.get(model, ()))
        return self._copies[model], self._contexts[model]

    def put(self, p: ProviderSnapshot) -> None:
        for model, in_flight, context in self._entries(p):
            copies, contexts = self._lists(model)
            insort(copies, (in_flight, p.name))
            insort(contexts, (context, p.name))

    def moved(self, old: ProviderSnapshot, new: ProviderSnapshot) -> None:
        """Replace ``old``'s entries by ``new``'s (the same provider), touching only the
        lists of the entries that differ."""
        before, after = self._entries(old), self._entries(new)
        for model, in_flight, context in before - after:
            copies, contexts = self._lists(model)
            for entries, entry in ((copies, (in_flight, old.name)),
                                   (contexts, (context, old.name))):
                at = bisect_left(entries, entry)
                if at < len(entries) and entries[at] == entry:
                    del entries[at]
        for model, in_flight, context in after - before:
            copies, contexts = self._lists(model)
            insort(copies, (in_flight, new.name))
            insort(contexts, (context, new.name))

    def take(self, p: ProviderSnapshot) -> None:
        for model, in_flight, context in self._entries(p):
            copies, contexts = self._lists(model)
            for entries, entry in ((copies, (in_flight, p.name)), (contexts, (context, p.name))):
                at = bisect_left(entries, entry)
                if at < len(entries) and entries[at] == entry:
                    del entries[at]

    def of(self, model: str) -> list[tuple[int, str]]:
        return self._copies.get(model, [])

    def smallest_context(self, model: str) -> int | None:
        contexts = self._contexts.get(model)
        if not contexts or contexts[0][0] == _FreeCopies.UNBOUNDED:
            return None
        return contexts[0][0]


class FleetSnapshot:
    """Every provider at one instant ``now`` (seconds since the epoch).

    Snapshots taken at different instants of an unchanged fleet share one
    :class:`FleetIndex`.
    """

    __slots__ = ("index", "now")

    def __init__(self, now: float, index: FleetIndex) -> None:
        self.now = now
        self.index = index

    @classmethod
    def of(cls, now: float, providers: Iterable[ProviderSnapshot]) -> FleetSnapshot:
        return cls(now, FleetIndex.build(providers))

    @property
    def providers(self) -> tuple[ProviderSnapshot, ...]:
        return self.index.providers

    def provider(self, name: str) -> ProviderSnapshot | None:
        return self.index.provider(name)

    def without(self, names: Iterable[str]) -> FleetSnapshot:
        """The same instant with the ``names`` providers left out (``self`` when none is
        here), for a call that must not go back where its connection was refused."""
        gone = [name for name in set(names) if self.index.provider(name) is not None]
        if not gone:
            return self
        return FleetSnapshot(self.now, self.index.replaced((), removed=gone))


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """How much one model is wanted in the near future (DESIGN §5).

    ``waiters`` are agents waiting for capacity for it now, ``intents`` agents selected
    for a thread that plan to call it. ``recent_use`` counts its recent calls, decayed
    over the use window, and ``prediction`` is the selection forecast: the selection
    frequencies of the agents that name it, summed. ``last_used_at`` only orders victims
    that are otherwise equally wanted (the least recently used goes first).
    """

    waiters: int = 0
    intents: int = 0
    recent_use: float = 0.0
    prediction: float = 0.0
    last_used_at: float | None = None

    @property
    def demand(self) -> float:
        """``waiters + intents + 0.5 · (recent use + prediction)``."""
        return self._weighed(self.waiters)

    @property
    def demand_besides_one_waiter(self) -> float:
        """The demand of the others when the call asking is one of the waiters."""
        return self._weighed(max(0, self.waiters - 1))

    def _weighed(self, waiters: int) -> float:
        return waiters + self.intents + 0.5 * (self.recent_use + self.prediction)


@quick_init
@dataclass(frozen=True, slots=True)
class DemandSnapshot:
    """Demand for every model named at one instant; a model not named is not wanted."""

    models: Mapping[str, ModelDemand] = field(default_factory=dict)
    at: float | None = None  # when the board was read (None: made by hand)

    def of(self, model: str) -> ModelDemand:
        return self.models.get(model, _NOT_WANTED)

    def demand(self, model: str) -> float:
        return self.of(model).demand


_NOT_WANTED = ModelDemand()
