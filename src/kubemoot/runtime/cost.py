"""The one cost, in expected seconds before a call can start (DESIGN §5).

Everything here is pure: it reads a :class:`FleetSnapshot`, the settings, occupancy and
demand, and does arithmetic. Warm reuse, cold load and eviction are priced in the same
unit so that one comparison decides between them::

    usable(P)      = totalVram(P) − reserve(P)
    resident(P)    = Σ resident footprints + Σ footprints of copies still loading
    free(P)        = usable(P) − resident(P)
    load(M)        = occupancy(M) / loadRate
    remaining(P,M) = max(0, load(M) − (now − loadStartedAt))   ; load(M) of this load:
                     its ticket's footprint / loadRate, else occupancy(M) / loadRate;
                     a load claimed behind another on P starts when that one ends
    queue(P,M)     = 0 if inflight < slots
                     else soonestRemaining + (inflight − slots) · latency / slots
    demand(V)      = waiters + intents + 0.5 · (recentUse + prediction)

    warm/loading copy : remaining + queue
    cold load         : line(P) + load(M) + 0.001 · freeAfter / GiB + max(0, k − s) · latency / s
                        ; line(P): until the loads under way on P have ended
    unload plan       : load(M) + Σ (unload + load(v) · demand(v))

In the one comparison a queue is priced with the calls expected behind it
(:meth:`CostModel.priced_queue`): ``(remaining + queue) · (1 + w · others(M))``, where
``others(M)`` is the demand for the model not counting the caller's own wait entry.
Those calls wait too, and a second copy would shorten their waits as well; a call alone
(no other demand) still never duplicates a model to dodge a busy slot.

A cold load is priced with the queueing it will cause (the slot-aware term): ``k`` calls
expected for the model within its load time (:meth:`CostModel.expected_calls`) share the
new copy's ``s`` slots, so the ``k − s`` beyond them wait a share of a call each. With no
company ``k`` is 1 and the term vanishes, which keeps the spec's worked examples exact.
Ties between
equally cheap copies go to the one with fewer calls in flight, then the provider name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from kubemoot.frozen import quick_init
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.snapshot import (
    DemandSnapshot,
    FleetSnapshot,
    ProviderSnapshot,
)
from kubemoot.settings import MIB_PER_GIB, RuntimeSettings

#: Seconds per GiB of room left over after a cold load: small enough never to outweigh
#: a real delay, large enough to prefer the tightest fit and keep big holes whole.
BEST_FIT_SECONDS_PER_GIB = 0.001


class OptionKind(StrEnum):
    """The ways a call can get a GPU; the order is the tie-break order."""

    WARM = "warm"  # a resident copy with a free slot
    LOADING = "loading"  # a copy another call is loading, with a free slot
    QUEUE = "queue"  # a warm or loading copy whose slots are all busy
    COLD_LOAD = "cold-load"  # load onto free room
    UNLOAD = "unload"  # unload idle models, then load

    @property
    def rank(self) -> int:
        """Ties go to reuse first, then a cold load, then eviction."""
        return _RANK[self]


_RANK = {
    OptionKind.WARM: 0,
    OptionKind.LOADING: 0,
    OptionKind.QUEUE: 0,
    OptionKind.COLD_LOAD: 1,
    OptionKind.UNLOAD: 2,
}

# Members read per option as module globals: on Python 3.11 a read through the class
# goes through EnumType.__getattr__'s hook (about 850 instructions, a global about 150).
_WARM, _LOADING, _QUEUE = OptionKind.WARM, OptionKind.LOADING, OptionKind.QUEUE
_COLD_LOAD, _UNLOAD = OptionKind.COLD_LOAD, OptionKind.UNLOAD


def load_seconds(mib: int, settings: RuntimeSettings) -> float:
    """Seconds to load ``mib`` of weights at the configured load rate."""
    return mib / settings.load_rate_mibps


def unload_floor_seconds(occupancy: int, settings: RuntimeSettings) -> float:
    """The cheapest any unload plan can be: load the model after one unload."""
    return load_seconds(occupancy, settings) + settings.unload_seconds


@quick_init
@dataclass(frozen=True, slots=True)
class Option:
    """One way to run a call of ``model`` on ``provider``, with its cost in seconds."""

    kind: OptionKind
    provider: str
    model: str
    seconds: float
    victims: tuple[str, ...] = ()
    footprint_mib: int = 0  # new VRAM the call's ticket would spend
    evicts: dict[str, int] = field(default_factory=dict)  # victim → MiB
    in_flight: int = 0  # calls on the copy, with the waiters placed there before this one

    def sort_key(
        self, model_order: Sequence[str] = ()
    ) -> tuple[float, int, int, str, int, str]:
        """Cheapest first; ties: warm, then cold, then unload; between copies, fewer calls
        in flight; then provider name (DESIGN §5).

        Fewer calls in flight spreads equally cheap work over the copies instead of
        stacking it on the first name. Only after the provider name do the candidates'
        order (preferred first) and the model name decide, so the order is total and
        repeatable.
        """
        order = model_order.index(self.model) if self.model in model_order else len(model_order)
        return (round(self.seconds, 9), self.kind.rank, self.in_flight, self.provider, order,
                self.model)

    def to_dict(self) -> dict[str, Any]:
        # The call log writes the cheapest options of every call: str() reads a StrEnum's
        # value in C, where ``.value`` goes through the enum's Python descriptor.
        return {
            "kind": str(self.kind),
            "provider": self.provider,
            "model": self.model,
            "seconds": round(self.seconds, 6),
            "victims": list(self.victims),
        }


class CostModel:
    """The cost terms over one fleet snapshot."""

    def __init__(
        self,
        fleet: FleetSnapshot,
        *,
        settings: RuntimeSettings,
        occupancy: OccupancyBook,
        demand: DemandSnapshot,
    ) -> None:
        self.fleet = fleet
        self.settings = settings
        self._occupancy = occupancy
        #: The demand this round is priced with (victims' reloads, queues' company).
        self.demand = demand
        #: Calls for a model already queued in this process's line before the asking
        #: call (:func:`kubemoot.runtime.options.spread`): company the demand board may
        #: not show yet, when they were issued in the same instant.
        self.queued_ahead: dict[str, int] = {}
        #: Whether this round plans an agent's first call at its selection (a held
        #: plan): its unload plans charge a duplicated victim's reload by the share of
        #: the model's slots it holds (:meth:`reload_demand`).
        self.at_selection = False
        self._lines: dict[str, dict[str, float]] = {}

    # -- per model -------------------------------------------------------------------

    @property
    def occupancy_book(self) -> OccupancyBook:
        return self._occupancy

    def occupancy(self, model: str) -> int | None:
        return self._occupancy.occupancy(model, self.fleet)

    def load(self, model: str) -> float | None:
        """Seconds to load the model; ``None`` when its size is unknown."""
        occupancy = self.occupancy(model)
        return None if occupancy is None else load_seconds(occupancy, self.settings)

    def unload_floor(self, model: str) -> float | None:
        """The cheapest unload plan for the model can cost (:func:`unload_floor_seconds`)."""
        occupancy = self.occupancy(model)
        return None if occupancy is None else unload_floor_seconds(occupancy, self.settings)

    # -- per (provider, model) -------------------------------------------------------

    def load_ends_at(self, p: ProviderSnapshot, model: str) -> float | None:
        """When the provider's copy of the model finishes loading; ``None``: it is ready.

        The load is as long as the footprint its ticket claimed: that is the size of
        this very load, whatever occupancy(M) says now. A loader without a footprint
        falls back to occupancy(M). When nothing sizes the model at all, the remaining
        time is unknown and counted at its lower bound, 0 s: the copy is still the
        model's only one (a model of unknown size cannot be cold-loaded), and a call
        that joins it starts the moment the engine reports it loaded. A card loads one
        model at a time, so a load claimed while another is under way there ends its
        own load time after that one (:meth:`_load_line`).
        """
        if p.load_started(model) is None:
            return None
        return self._load_line(p)[model]

    def _own_load(self, p: ProviderSnapshot, model: str) -> float:
        """Seconds the load of ``model`` under way on ``p`` takes on its own."""
        mib = p.load_mib(model)
        if mib is None:
            return self.load(model) or 0.0
        return load_seconds(mib, self.settings)

    def _load_line(self, p: ProviderSnapshot) -> dict[str, float]:
        """When each copy loading on ``p`` finishes: a card loads one model at a time,
        in the order the loads were claimed, so a load claimed behind another one
        starts when that one ends (computed once per provider and round)."""
        line = self._lines.get(p.name)
        if line is None:
            loading = sorted(
                (started, m) for m in {t.model for t in p.tickets}
                if (started := p.load_started(m)) is not None
            )
            line, free_at = {}, float("-inf")
            for started, m in loading:
                free_at = max(started, free_at) + self._own_load(p, m)
                line[m] = free_at
            self._lines[p.name] = line
        return line

    def load_line_wait(self, p: ProviderSnapshot) -> float:
        """Seconds until ``p`` has finished the loads under way: a new load starts then."""
        line = self._load_line(p)
        return max(0.0, max(line.values()) - self.fleet.now) if line else 0.0

    def remaining(self, p: ProviderSnapshot, model: str) -> float:
        """Load time still to go for a copy being loaded (0 for a resident copy)."""
        ends = self.load_ends_at(p, model)
        return 0.0 if ends is None else max(0.0, ends - self.fleet.now)

    def queue(self, p: ProviderSnapshot, model: str, *, ahead: int = 0) -> float:
        """Wait for a slot on the provider's copy, counted from when the copy is ready.

        ``ahead`` counts calls queued for this copy before this one that hold no ticket
        yet (waiters): they are part of the copy's backlog, so they count as in flight.
        An in-flight call ends one latency after it starts; it starts when it was
        claimed or when the copy became ready, whichever is later.
        """
        in_flight = len(p.in_flight(model))
        slots = p.slots
        backlog = in_flight + ahead
        if backlog < slots:
            return 0.0
        latency = p.latency_seconds
        ends = self.load_ends_at(p, model)
        ready = max(self.fleet.now, ends) if ends is not None else self.fleet.now
        first = p.first_call_started(model)
        if first is None:
            soonest = latency
        else:
            # A call starts when it was claimed or when its copy finished loading; the
            # earliest claimed call therefore ends first.
            start = max(first, ends) if ends is not None else first
            soonest = max(0.0, start + latency - ready)
        if in_flight < slots:
            # Waiters ahead take the free slots as soon as the copy is ready.
            soonest = min(soonest, latency)
        return soonest + (backlog - slots) * latency / slots

    # -- options ---------------------------------------------------------------------

    def copy_option(self, p: ProviderSnapshot, model: str, *, ahead: int = 0) -> Option:
        """Use the warm or loading copy of ``model`` on ``p`` (behind ``ahead`` waiters)."""
        queue = self.queue(p, model, ahead=ahead)
        remaining = self.remaining(p, model)
        if queue > 0 or not p.has_free_slot(model, ahead=ahead):
            kind = _QUEUE
        elif p.is_resident(model):
            kind = _WARM
        else:
            kind = _LOADING
        return Option(kind, p.name, model, remaining + queue,
                      in_flight=len(p.in_flight(model)) + ahead)

    def priced_queue(self, option: Option) -> Option:
        """A queue option priced with the other calls expected for its model.

        Calls for the model that wait, are planned (intents) or recur (recent use and
        the selection forecast, at half weight as in ``demand``) will queue behind this
        one; a second copy shortens their waits too. The caller's own wait entry is not
        counted, so a call with no company is priced by its own wait alone, the spec's
        rule that a model is never duplicated just to dodge a busy slot.
        """
        weight = self.settings.queue_demand_weight
        if option.kind is not _QUEUE or option.seconds <= 0 or weight <= 0:
            return option
        others = max(self.demand.of(option.model).demand_besides_one_waiter,
                     float(self.queued_ahead.get(option.model, 0)))
        if others <= 0:
            return option
        return replace(option, seconds=option.seconds * (1.0 + weight * others))

    def expected_calls(self, model: str, within: float) -> float:
        """Calls expected for ``model`` within ``within`` seconds, the asking one included.

        The asking call, the other waiters and the intents are certain; recent use is a
        count decayed with time constant ``W`` (the demand use window), so about
        ``recent_use / W`` calls arrive per second and ``recent_use · within / W`` of
        them in the window. The selection forecast is a share, not a rate: left out.
        """
        d = self.demand.of(model)
        window = self.settings.demand_use_window_seconds
        arriving = d.recent_use * within / window if window > 0 else 0.0
        return 1.0 + max(0, d.waiters - 1) + d.intents + arriving

    def crowding(self, p: ProviderSnapshot, model: str, occupancy: int) -> float:
        """Seconds of slot queueing a new copy on ``p`` will cause: ``max(0, k − s) · latency / s``.

        ``k`` calls expected over the load (:meth:`expected_calls`) share the copy's
        ``s`` slots; each one beyond them waits about a call's latency spread over the
        slots. This is what stops best fit from sending a fan-out model to the card with
        the fewest slots (DESIGN §5, slot-aware cold loads).
        """
        k = self.expected_calls(model, load_seconds(occupancy, self.settings))
        slots = p.slots
        return max(0.0, k - slots) * p.latency_seconds / slots

    def cold_option(self, p: ProviderSnapshot, model: str, occupancy: int) -> Option:
        """Load ``model`` onto free room on ``p`` (the caller checked it fits)."""
        free = (p.free_mib or 0) + p.lapsing_mib(model)  # its lapsing copy's is its own
        free_after_gib = (free - occupancy) / MIB_PER_GIB
        seconds = load_seconds(occupancy, self.settings) + self.load_line_wait(p)
        seconds += BEST_FIT_SECONDS_PER_GIB * free_after_gib
        seconds += self.crowding(p, model, occupancy)
        return Option(_COLD_LOAD, p.name, model, seconds, footprint_mib=occupancy)

    def reload_demand(self, p: ProviderSnapshot, victim: str) -> float:
        """How many of ``victim``'s expected calls its reload is charged for, when it
        is unloaded from ``p``: ``demand(victim)``, except in a plan made at selection
        where other copies can take them all.

        A victim whose model stays resident elsewhere is not reloaded for every call
        it is expected to get: when the other ready copies (not planned for release
        themselves) have at least ``demand(victim)`` free slots between them, the
        copy unloaded only carried its share of them, ``slots(P) / Σ slots`` over
        this copy and the others. Memory-tight's cut: at 111 s two researchers were
        selected for ``qwen3:14b``, whose two copies' slots were taken, and the plan
        queued (39.5 s) rather than unload one of three idle coder copies (44.4 s,
        as if every coder call would need the unloaded copy back); its two first
        calls then waited 13 s each for that very unload. Only at selection: the
        same rule for every call took fleet-16's mean wait from 0.295 to 0.311 s on
        seed 7 and from 0.326 to 0.334 s on seed 2 (docs/simulator.md). A victim
        alone in the fleet, or wanted by more calls than the others can start, keeps
        the full charge, so DESIGN §5's worked examples are unchanged.
        """
        demand = self.demand.demand(victim)
        if not self.at_selection or demand <= 0:
            return demand
        others = [
            q for q in self.fleet.index.copies_of(victim)
            if q.name != p.name and q.is_resident(victim) and q.state.ready
            and not q.circuit_open and victim not in q.planned_victims()
        ]
        free = sum(max(0, q.slots - len(q.in_flight(victim))) for q in others)
        if not others or free < demand:
            return demand
        return demand * p.slots / (p.slots + sum(q.slots for q in others))

    def unload_option(
        self, p: ProviderSnapshot, model: str, occupancy: int, victims: Sequence[str]
    ) -> Option:
        """Unload ``victims`` from ``p``, then load ``model``."""
        residents = p.residents
        seconds = load_seconds(occupancy, self.settings)
        for victim in victims:
            # An unloaded model reloads from disk at the same rate as any load.
            size = self.occupancy(victim) or residents[victim]
            reload = load_seconds(size, self.settings)
            seconds += self.settings.unload_seconds + reload * self.reload_demand(p, victim)
        return Option(
            _UNLOAD,
            p.name,
            model,
            seconds,
            victims=tuple(victims),
            footprint_mib=occupancy,
            evicts={v: residents[v] for v in victims},
        )
