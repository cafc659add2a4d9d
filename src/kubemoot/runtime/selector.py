"""ProviderSelector: options for one model over one fleet snapshot, and claiming them.

The selector lists what a call could do with a model — share a warm or loading copy,
load it onto free room, or unload idle models to make room — each as an
:class:`~kubemoot.runtime.cost.Option` priced by the cost model, after the hard
filters. Claiming re-checks the option inside the ticket compare-and-set loop, so an
option that went away between reading and claiming is refused, never overcommitted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kubemoot.gates.results import GateResult
from kubemoot.runtime import filters
from kubemoot.runtime.cost import CostModel, Option, OptionKind
from kubemoot.runtime.eviction import EvictionPlanner, idle_residents
from kubemoot.runtime.snapshot import FleetSnapshot, ProviderSnapshot
from kubemoot.runtime.tickets import ClaimConflict, ClaimRejected, TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.store.documents import ProviderState, Ticket, TicketState

VICTIMS = "victims"

ClaimCheck = Callable[[ProviderState | None, list[Ticket], float], bool]


@dataclass(slots=True)
class Round:
    """One planning round: a snapshot, its cost model, the prompt, and gate evidence."""

    fleet: FleetSnapshot
    cost: CostModel
    prompt_tokens: int | None = None
    #: gate results per candidate id ``provider/model`` (filled as options are listed)
    gates: dict[str, list[GateResult]] = field(default_factory=dict)
    #: waiters queued before this call, per copy ``(provider, model)`` (see ``spread``)
    ahead: dict[tuple[str, str], int] = field(default_factory=dict)
    _priced: dict[tuple[str, str, int], Option] = field(default_factory=dict, repr=False)

    def record(self, provider: str, model: str, results: list[GateResult]) -> bool:
        self.gates[f"{provider}/{model}"] = results
        return filters.feasible(results)

    def ahead_of(self, provider: str, model: str) -> int:
        return self.ahead.get((provider, model), 0)

    def copy_option(self, p: ProviderSnapshot, model: str, ahead: int | None = None) -> Option:
        """The cost model's copy option, priced once per round (it is asked often)."""
        if ahead is None:
            ahead = self.ahead_of(p.name, model)
        key = (p.name, model, ahead)
        option = self._priced.get(key)
        if option is None:
            option = self._priced[key] = self.cost.copy_option(p, model, ahead=ahead)
        return option


@dataclass(frozen=True, slots=True)
class Claim:
    """A ticket held on a provider for an option."""

    option: Option
    ticket: Ticket
    endpoint: str
    context_length: int | None


class ProviderSelector:
    """Lists, prices and claims the options of one model."""

    def __init__(self, view: ProviderView, tickets: TicketManager) -> None:
        self.view = view
        self.tickets = tickets

    # -- options ---------------------------------------------------------------------

    def _usable_copies(self, rnd: Round, model: str) -> list[ProviderSnapshot]:
        """Providers whose warm or loading copy of ``model`` passes the warm filter.

        A copy passed over keeps its gate evidence, so the record says why.
        """
        usable: list[ProviderSnapshot] = []
        for p in rnd.fleet.index.copies_of(model):
            if filters.warm_ok(p, model, rnd.prompt_tokens):
                usable.append(p)
            else:
                rnd.record(p.name, model, filters.warm_gates(p, model, rnd.prompt_tokens))
        return usable

    def spread(self, rnd: Round, models: Sequence[str], ahead: int) -> None:
        """Put ``ahead`` earlier waiters on the copies they would take, one at a time.

        Calls queued before this one hold no ticket, yet they will take slots before it
        does: each goes to the copy that would start it soonest, as it would itself
        decide. What is left is this call's view of every copy's backlog (``rnd.ahead``).
        Only the ``ahead`` cheapest copies of each model can ever be picked (a copy
        outside them always has a cheaper one still unpicked), so only they are priced
        further.
        """
        rnd.ahead.clear()
        if ahead <= 0:
            return
        heap: list[tuple[float, int, str, str]] = []
        for order, model in enumerate(models):
            priced = sorted(
                (rnd.copy_option(p, model, 0).seconds, p.name)
                for p in self._usable_copies(rnd, model)
            )
            heap.extend((seconds, order, name, model) for seconds, name in priced[:ahead])
        heapq.heapify(heap)
        for _ in range(ahead):
            if not heap:
                return
            _seconds, order, name, model = heapq.heappop(heap)
            key = (name, model)
            rnd.ahead[key] = rnd.ahead.get(key, 0) + 1
            p = rnd.fleet.provider(name)
            assert p is not None
            option = rnd.copy_option(p, model, rnd.ahead[key])
            heapq.heappush(heap, (option.seconds, order, name, model))

    def copy_options(
        self, rnd: Round, model: str, *, free_slot: bool, limit: int | None = None
    ) -> list[Option]:
        """Warm or loading copies of ``model`` that pass the warm filter, cheapest first.

        With ``limit`` only that many are listed, and only their gate evidence is kept;
        without it every copy's gates are recorded (for an explanation).
        """
        if limit is None:
            for p in rnd.fleet.index.copies_of(model):
                rnd.record(p.name, model, filters.warm_gates(p, model, rnd.prompt_tokens))
        options: list[Option] = []
        for p in self._usable_copies(rnd, model):
            ahead = rnd.ahead_of(p.name, model)
            if free_slot and not rnd.cost.has_free_slot(p, model, ahead=ahead):
                continue
            options.append(rnd.copy_option(p, model, ahead))
        options.sort(key=Option.sort_key)
        if limit is not None:
            del options[limit:]
            for o in options:
                p = _provider(rnd, o)
                rnd.record(p.name, model, filters.warm_gates(p, model, rnd.prompt_tokens))
        return options

    def loading_options(self, rnd: Round, model: str) -> list[Option]:
        """Copies of ``model`` another call is loading right now (any slot state)."""
        options = [
            rnd.copy_option(p, model)
            for p in self._usable_copies(rnd, model) if not p.is_resident(model)
        ]
        for o in options:
            p = _provider(rnd, o)
            rnd.record(p.name, model, filters.warm_gates(p, model, rnd.prompt_tokens))
        return sorted(options, key=Option.sort_key)

    def cold_options(self, rnd: Round, model: str, *, limit: int | None = None) -> list[Option]:
        """Loads of ``model`` onto free room, on providers where it has no copy.

        With ``limit`` only that many of the tightest fits are listed (they are the
        cheapest: every cold load of a model costs the same load time plus the
        best-fit term), found through the room index; without it every provider is
        judged and its gates recorded (for an explanation).
        """
        occupancy = rnd.cost.occupancy(model)
        if limit is not None:
            if occupancy is None:
                return []
            providers: Iterable[ProviderSnapshot] = rnd.fleet.index.with_room(occupancy)
        else:
            providers = rnd.fleet.providers
        options: list[Option] = []
        for p in providers:
            if p.has_copy(model):
                continue
            gates = filters.cold_gates(
                p, model, occupancy=occupancy, usable=p.usable_mib,
                resident=rnd.cost.resident(p), prompt_tokens=rnd.prompt_tokens,
            )
            if rnd.record(p.name, model, gates) and occupancy is not None:
                options.append(rnd.cost.cold_option(p, model, occupancy))
                if limit is not None and len(options) >= limit:
                    break
        return sorted(options, key=Option.sort_key)

    def plan_eviction(self, rnd: Round, model: str) -> list[Option]:
        """Per provider that could hold ``model`` once idle residents leave, its plan."""
        occupancy = rnd.cost.occupancy(model)
        if occupancy is None:
            return []
        planner = EvictionPlanner(rnd.cost.needs)
        options: list[Option] = []
        for p in rnd.fleet.providers:
            usable, free = p.usable_mib, p.free_mib
            if usable is None or free is None or free >= occupancy or occupancy > usable:
                continue  # a cold load needs no victims; a too-small card no plan
            if p.has_copy(model):
                continue
            gates = [
                filters.ready_gate(p),
                filters.circuit_gate(p),
                filters.context_gate(p, model, rnd.prompt_tokens),
            ]
            if not filters.feasible(gates):
                rnd.gates[f"{p.name}/{model} (unload)"] = gates
                continue
            victims = planner.choose_victims(
                idle_residents(p, exclude=model), occupancy - free
            )
            if victims:
                gates.append(GateResult.pass_(
                    VICTIMS, "idle residents make room", victims=list(victims),
                    neededMiB=occupancy - free,
                ))
            else:
                gates.append(GateResult.fail(
                    VICTIMS, "idle residents cannot make room (models with live work stay)",
                    neededMiB=occupancy - free,
                ))
            rnd.gates[f"{p.name}/{model} (unload)"] = gates
            if victims:
                options.append(rnd.cost.unload_option(p, model, occupancy, victims))
        return sorted(options, key=Option.sort_key)

    def loading_queue(self, rnd: Round, models: Sequence[str]) -> Option | None:
        """The loading copy to queue at when every loading copy's slots are taken.

        Candidates in order (preferred first), cheapest copy of each: the call converges
        on a model that is already coming instead of loading a second one.
        """
        for model in models:
            queues = [o for o in self.loading_options(rnd, model) if o.kind is OptionKind.QUEUE]
            if queues:
                return min(queues, key=Option.sort_key)
        return None

    # -- claims ----------------------------------------------------------------------

    async def pick_and_claim_warm(
        self, rnd: Round, model: str, holder_id: str, *, state: TicketState = TicketState.RUNNING
    ) -> Claim | None:
        """Share a warm (resident or loading) copy with a free slot, cheapest first."""
        shortlist = rnd.cost.settings.copy_shortlist
        for option in self.copy_options(rnd, model, free_slot=True, limit=shortlist):
            claim = await self.claim(rnd, option, holder_id, state=state)
            if claim is not None:
                return claim
        return None

    async def pick_and_claim_loading(
        self, rnd: Round, model: str, holder_id: str, *, state: TicketState = TicketState.RUNNING
    ) -> Claim | None:
        """Join a copy another call is loading and that has a free slot.

        A loading copy whose slots are all taken is not claimed here: the planner
        queues the call at it (:meth:`loading_queue`), still converging on the copy.
        """
        loading = [o for o in self.loading_options(rnd, model) if o.kind is not OptionKind.QUEUE]
        for option in sorted(loading, key=Option.sort_key):
            claim = await self.claim(rnd, option, holder_id, state=state)
            if claim is not None:
                return claim
        return None

    async def claim(
        self, rnd: Round, option: Option, holder_id: str, *, state: TicketState
    ) -> Claim | None:
        """Claim a ticket for a warm, loading or cold option; ``None`` if it went away."""
        p = _provider(rnd, option)
        cold = option.kind is OptionKind.COLD_LOAD
        if cold and state is TicketState.RUNNING:
            state = TicketState.LOADING
        check = (
            _cold_check(option.model, rnd.prompt_tokens) if cold
            else _copy_check(option, rnd.prompt_tokens, free_slot=option.kind is not
                             OptionKind.QUEUE, ahead=rnd.ahead_of(option.provider,
                                                                  option.model))
        )
        ticket = await self.claim_ticket(
            option, holder_id, state=state, check=check, provider_state=p.state
        )
        if ticket is None:
            return None
        return Claim(option, ticket, p.state.endpoint, p.context_for(option.model))

    async def claim_ticket(
        self,
        option: Option,
        holder_id: str,
        *,
        state: TicketState,
        check: ClaimCheck,
        evicts: Mapping[str, int] | None = None,
        provider_state: ProviderState | None = None,
    ) -> Ticket | None:
        # ``provider_state``: the round's copy, so the claim need not read it again.
        try:
            ticket = await self.tickets.claim(
                option.provider, option.model, option.footprint_mib, holder_id,
                state=state, evicts=dict(evicts) if evicts else None, check=check,
                provider_state=provider_state,
            )
        except (ClaimRejected, ClaimConflict):
            self.view.invalidate(option.provider)  # the state moved: read it again
            return None
        self.view.note_claimed(option.provider, ticket)
        return ticket


def _provider(rnd: Round, option: Option) -> ProviderSnapshot:
    p = rnd.fleet.provider(option.provider)
    if p is None:  # options are only ever made from the round's own providers
        raise LookupError(option.provider)
    return p


def fresh_provider(state: ProviderState, tickets: list[Ticket], now: float) -> ProviderSnapshot:
    """A provider snapshot built inside a claim from the documents being updated."""
    return ProviderSnapshot(state=state, tickets=tuple(t for t in tickets if t.expires_at > now))


def _copy_check(
    option: Option, prompt_tokens: int | None, *, free_slot: bool, ahead: int = 0
) -> ClaimCheck:
    def check(state: ProviderState | None, tickets: list[Ticket], now: float) -> bool:
        if state is None:
            return False
        p = fresh_provider(state, tickets, now)
        if not p.has_copy(option.model):
            return False
        if not filters.feasible(filters.warm_gates(p, option.model, prompt_tokens)):
            return False
        return not free_slot or len(p.in_flight(option.model)) + ahead < p.slots

    return check


def _cold_check(model: str, prompt_tokens: int | None) -> ClaimCheck:
    def check(state: ProviderState | None, tickets: list[Ticket], now: float) -> bool:
        if state is None:
            return False
        p = fresh_provider(state, tickets, now)
        gates = [filters.ready_gate(p), filters.context_gate(p, model, prompt_tokens)]
        return filters.feasible(gates)  # the memory itself is the budget's to judge

    return check
