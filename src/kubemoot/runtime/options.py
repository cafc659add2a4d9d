"""The options of one planning round, priced: what a call could do, and what it costs.

Pure: everything here reads a :class:`~kubemoot.runtime.snapshot.FleetSnapshot`, the
demand, the cost model and occupancy, and returns values. No store, no tickets, no
clock, nothing async; claiming an option is :mod:`kubemoot.runtime.claims`' work, and
:class:`~kubemoot.runtime.planner.CallPlanner` composes the two: price, pick, claim.

The options of a model (DESIGN §5), each an :class:`~kubemoot.runtime.cost.Option`
priced by :class:`~kubemoot.runtime.cost.CostModel` after the hard filters:

* a **copy** — share a warm or loading copy, with a free slot or by queueing;
* a **cold load** onto free room;
* an **unload plan** — unload idle models to make room, then load.

A :class:`Round` carries one snapshot with its cost model, the prompt, the calls
queued before this one (``ahead``) and the gate evidence of every pair looked at, for
the decision record.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from operator import itemgetter
from typing import cast

from kubemoot.gates.results import GateResult
from kubemoot.runtime import filters
from kubemoot.runtime.cost import CostModel, Option, OptionKind, load_seconds, unload_floor_seconds
from kubemoot.runtime.eviction import EvictionPlanner, idle_residents
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ProviderSnapshot
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import TicketState

VICTIMS = "victims"

#: A candidate's gate results, or the question that gives them (a warm copy's gates,
#: worked out when a record is read: a placement's record is built only when asked
#: for, and most are never asked for).
Evidence = list[GateResult] | partial[list[GateResult]]


def evidence(gathered: dict[str, Evidence]) -> dict[str, list[GateResult]]:
    """``gathered`` with every deferred gate list worked out, in place, in its order."""
    for cid, results in gathered.items():
        if not isinstance(results, list):
            gathered[cid] = results()  # a value changes, the keys and order do not
    return cast(dict[str, list[GateResult]], gathered)


@dataclass(slots=True)
class Round:
    """One planning round: a snapshot, its cost model, the prompt, and gate evidence."""

    fleet: FleetSnapshot
    cost: CostModel
    prompt_tokens: int | None = None
    #: gate results per candidate id ``provider/model`` (filled as options are listed;
    #: read them through :attr:`gates`)
    gathered: dict[str, Evidence] = field(default_factory=dict)
    #: waiters queued before this call, per copy ``(provider, model)`` (see :func:`spread`)
    ahead: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the fleet before any provider was excluded (``None``: nothing was); a refusal is
    #: judged on it, since an excluded provider still shows what would fit and where
    whole: FleetSnapshot | None = None
    #: expected prefill per copy ``(provider, model)`` of a call whose thread a copy's
    #: prompt cache may hold, and under ``("", "")`` anywhere else (the whole prompt);
    #: empty for a call with no thread (:meth:`kubemoot.runtime.prefix.PrefixBook.seconds`)
    prefill: dict[tuple[str, str], float] = field(default_factory=dict)
    _priced: dict[tuple[str, str, int], Option] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        fleet: FleetSnapshot,
        demand: DemandSnapshot,
        *,
        settings: RuntimeSettings,
        occupancy: OccupancyBook,
        prompt_tokens: int | None,
        exclude: Iterable[str] = (),
    ) -> Round:
        """A round over ``fleet`` less the ``exclude`` providers: they are filtered out
        before anything is priced, so no price has to know about them."""
        seen = fleet.without(exclude) if exclude else fleet
        if seen is not fleet:
            # what the left-out providers show about model sizes is still true
            occupancy.observe(fleet)
        cost = CostModel(seen, settings=settings, occupancy=occupancy, demand=demand)
        return cls(fleet=seen, cost=cost, prompt_tokens=prompt_tokens,
                   whole=fleet if seen is not fleet else None)

    def judged(self) -> tuple[FleetSnapshot, CostModel]:
        """The fleet and cost model a refusal is classified on (the whole fleet)."""
        if self.whole is None:
            return self.fleet, self.cost
        c = self.cost
        return self.whole, CostModel(self.whole, settings=c.settings,
                                     occupancy=c.occupancy_book, demand=c.demand)

    @property
    def gates(self) -> dict[str, list[GateResult]]:
        """Gate results per candidate id ``provider/model``, in the order gathered."""
        return evidence(self.gathered)

    def record(self, provider: str, model: str, results: list[GateResult]) -> bool:
        self.gathered[f"{provider}/{model}"] = results
        return filters.feasible(results)

    def record_warm(self, p: ProviderSnapshot, model: str) -> None:
        """Keep the warm gates of ``p``'s copy of ``model`` as evidence, worked out when
        read (the snapshot is a value, so they come out as they would now).

        Only for a copy that passes the warm filter (``filters.warm_ok``): a call's
        summary takes these gates for passed without working them out.
        """
        self.gathered[f"{p.name}/{model}"] = partial(
            filters.warm_gates, p, model, self.prompt_tokens
        )

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

    def with_prefill(self, option: Option) -> Option:
        """The option with the prefill its copy's prompt cache leaves to do.

        Every option of a call with a thread pays the prefill of its whole prompt,
        except on a copy whose cache still holds the thread: there only what the thread
        added since. Without a thread nothing is added, so the spec's worked examples
        stay exact.
        """
        if not self.prefill:
            return option
        seconds = self.prefill.get((option.provider, option.model), self.prefill[("", "")])
        return replace(option, seconds=option.seconds + seconds) if seconds else option

    def provider_of(self, option: Option) -> ProviderSnapshot:
        p = self.fleet.provider(option.provider)
        if p is None:  # options are only ever made from the round's own providers
            raise LookupError(option.provider)
        return p


# -- copies ---------------------------------------------------------------------------


def _usable_copies(rnd: Round, model: str) -> list[ProviderSnapshot]:
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


def _record_warm(rnd: Round, options: Iterable[Option]) -> None:
    for o in options:
        rnd.record_warm(rnd.provider_of(o), o.model)


def spread(rnd: Round, models: Sequence[str], ahead: int) -> None:
    """Put ``ahead`` earlier waiters on the copies they would take, one at a time.

    Calls queued before this one hold no ticket, yet they will take slots before it
    does: each goes to the copy that would start it soonest, as it would itself decide.
    What is left is this call's view of every copy's backlog (``rnd.ahead``). Only the
    ``ahead`` cheapest copies of each model can ever be picked (a copy outside them
    always has a cheaper one still unpicked), so only they are priced further.
    """
    rnd.ahead.clear()
    rnd.cost.queued_ahead = {models[0]: ahead} if ahead > 0 else {}
    if ahead <= 0:
        return
    heap: list[tuple[float, int, str, str]] = []
    for order, model in enumerate(models):
        priced = sorted(
            (rnd.copy_option(p, model, 0).seconds, p.name) for p in _usable_copies(rnd, model)
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


def count_planned(rnd: Round, planned: Mapping[tuple[str, str], int]) -> None:
    """Count the first calls planned onto copies at selection as calls ahead there.

    A plan that shares a copy holds no ticket, and a held plan's ticket takes no slot
    (it is not a call yet), so without this every agent selected in the same instant
    would count on the same free slot and none would load a copy of its own. Only the
    copies this round can see are counted.
    """
    for (provider, model), count in planned.items():
        if count > 0 and rnd.fleet.provider(provider) is not None:
            key = (provider, model)
            rnd.ahead[key] = rnd.ahead.get(key, 0) + count


def copy_options(
    rnd: Round, model: str, *, free_slot: bool, limit: int | None = None,
    prefill: bool = True,
) -> list[Option]:
    """Warm or loading copies of ``model`` that pass the warm filter, cheapest first.

    With ``limit`` only that many are listed, and only their gate evidence is kept;
    without it every copy's gates are recorded (for an explanation).
    """
    if limit is None:
        for p in rnd.fleet.index.copies_of(model):
            rnd.record(p.name, model, filters.warm_gates(p, model, rnd.prompt_tokens))
    elif free_slot:
        return _free_copies(rnd, model, limit, prefill=prefill)
    options: list[Option] = []
    for p in _usable_copies(rnd, model):
        ahead = rnd.ahead_of(p.name, model)
        if free_slot and not p.has_free_slot(model, ahead=ahead):
            continue
        option = rnd.copy_option(p, model, ahead)
        options.append(rnd.with_prefill(option) if prefill else option)
    options.sort(key=Option.sort_key)
    if limit is not None:
        del options[limit:]
        _record_warm(rnd, options)
    return options


def _free_copies(rnd: Round, model: str, limit: int, *, prefill: bool) -> list[Option]:
    """The ``limit`` cheapest copies of ``model`` with a free slot, as :func:`copy_options`
    lists them, pricing only the copies that can make the list.

    A model has a copy on hundreds of cards in a big fleet, and this runs for every call.
    A resident copy with a free slot waits for no load and no slot: its option is warm
    and costs the call's prefill alone, so its sort key (seconds, rank, calls in flight,
    name) is known without the cost model. Copies still loading are priced as usual.
    The order is exactly :meth:`Option.sort_key`'s: the keys compared here are its
    first four terms, and the rest are the same for every copy of one model.
    """
    priced_prefill = prefill and bool(rnd.prefill)
    elsewhere = rnd.prefill[("", "")] if priced_prefill else 0.0
    keyed = _indexed_free_copies(rnd, model, limit, elsewhere, prefill=prefill)
    if keyed is None:
        keyed = _keyed_free_copies(rnd, model, elsewhere, prefill=prefill)
    options: list[Option] = []
    for (_seconds, rank, in_flight, name), p in heapq.nsmallest(limit, keyed,
                                                                key=itemgetter(0)):
        if rank == _WARM_RANK and p.is_resident(model):
            # A resident copy with a slot free behind its waiters: no load to wait for
            # and no queue, so the cost model's price is 0 s, and the key already holds
            # its calls in flight (:meth:`CostModel.copy_option`, without asking it).
            option = Option(_WARM, name, model, 0.0, in_flight=in_flight)
        else:
            option = rnd.copy_option(p, model, rnd.ahead_of(name, model))
        options.append(rnd.with_prefill(option) if prefill else option)
        rnd.record_warm(p, model)
    return options


_WARM_RANK = OptionKind.WARM.rank
# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read under callgrind, a module global about
# 150): the members read once or more per call are kept at module level.
_WARM, _LOADING = OptionKind.WARM, OptionKind.LOADING
_Keyed = list[tuple[tuple[float, int, int, str], ProviderSnapshot]]


def _indexed_free_copies(
    rnd: Round, model: str, limit: int, elsewhere: float, *, prefill: bool
) -> _Keyed | None:
    """The sort keys of :func:`_free_copies`' candidates, read off the index's sorted
    free copies; ``None`` when a copy's price is its own and every copy must be priced.

    With no waiter placed on a copy of the model and no copy holding the call's thread,
    every resident copy with a free slot costs the same, so the index's order (fewest
    calls in flight, then name) is the price order and only its first ``limit`` can be
    listed. The model's other copies (loading, full, or failing a warm gate) are judged
    one by one in name order, as :func:`_usable_copies` does, so the gate evidence is
    the same. A prompt larger than a free copy's context sends the call down the
    one-by-one path.
    """
    if rnd.ahead and any(m == model for _p, m in rnd.ahead):
        return None
    if prefill and rnd.prefill and any(p and m == model for p, m in rnd.prefill):
        return None
    index = rnd.fleet.index
    prompt = rnd.prompt_tokens
    smallest = index.smallest_free_context(model)
    if prompt is not None and smallest is not None and prompt > smallest:
        return None
    free = index.free_copies(model)
    keyed: _Keyed = []
    seconds = round(elsewhere, 9)
    for in_flight, name in free[:limit]:
        # A listed copy passes the warm filter: the list holds only copies of ready,
        # closed-circuit providers that no ticket plans to unload, and every context
        # in it holds the prompt (the smallest does, above).
        p = index.provider(name)
        if p is None:
            return None
        keyed.append(((seconds, 0, in_flight, name), p))
    if index.copy_count(model) == len(free):
        return keyed
    listed = {name for _in_flight, name in free}
    for p in index.copies_of(model):
        if p.name in listed:
            continue
        if not filters.warm_ok(p, model, prompt):
            rnd.record(p.name, model, filters.warm_gates(p, model, prompt))
        elif p.has_free_slot(model):
            keyed.append((_key(rnd, p, model, 0, prefill=prefill), p))
    return keyed


def _key(
    rnd: Round, p: ProviderSnapshot, model: str, ahead: int, *, prefill: bool
) -> tuple[float, int, int, str]:
    option = rnd.copy_option(p, model, ahead)
    option = rnd.with_prefill(option) if prefill else option
    rounded, rank, in_flight, provider, _order, _model = option.sort_key()
    return (rounded, rank, in_flight, provider)


def _keyed_free_copies(rnd: Round, model: str, elsewhere: float, *, prefill: bool) -> _Keyed:
    """The sort keys of every usable copy of ``model`` with a free slot, one by one."""
    priced_prefill = prefill and bool(rnd.prefill)
    keyed: _Keyed = []
    for p in _usable_copies(rnd, model):
        name = p.name
        ahead = rnd.ahead.get((name, model), 0) if rnd.ahead else 0
        if not p.has_free_slot(model, ahead=ahead):
            continue
        if p.is_resident(model):
            # as Round.with_prefill adds it to the warm option's 0 s
            seconds = rnd.prefill.get((name, model), elsewhere) if priced_prefill else 0.0
            key = (round(seconds, 9), 0, len(p.in_flight(model)) + ahead, name)
        else:
            key = _key(rnd, p, model, ahead, prefill=prefill)
        keyed.append((key, p))
    return keyed


def warm_options(rnd: Round, model: str) -> list[Option]:
    """Step 1 and 2: the cheapest few warm or loading copies with a free slot.

    For a call whose thread a copy's prompt cache holds, a free slot elsewhere that
    costs more than waiting at that copy (its queue plus the little prefill left) is
    no cheap case: the one comparison decides between them.
    """
    options = copy_options(rnd, model, free_slot=True, limit=rnd.cost.settings.copy_shortlist)
    holding = _holding_copy(rnd)
    return [o for o in options if holding is None or o.seconds <= holding]


def _holding_copy(rnd: Round) -> float | None:
    """The cheapest copy that holds the call's thread, queue included; None: none does."""
    best: float | None = None
    for provider, model in rnd.prefill:
        p = rnd.fleet.provider(provider) if provider else None
        if p is None or not p.has_copy(model):
            continue
        seconds = rnd.with_prefill(rnd.copy_option(p, model)).seconds
        best = seconds if best is None else min(best, seconds)
    return best


def loading_options(rnd: Round, model: str) -> list[Option]:
    """Copies of ``model`` another call is loading right now (any slot state)."""
    options = [
        rnd.copy_option(p, model)
        for p in _usable_copies(rnd, model) if not p.is_resident(model)
    ]
    _record_warm(rnd, options)
    return sorted(options, key=Option.sort_key)


def joinable_loading(rnd: Round, model: str) -> list[Option]:
    """Step 3 with a free slot: loading copies of ``model`` the call can join now.

    A loading copy whose slots are all taken is not among them: the call queues there
    instead (:func:`loading_queue`), still converging on the copy.
    """
    return [o for o in loading_options(rnd, model) if o.kind is not OptionKind.QUEUE]


def loading_queue(rnd: Round, models: Sequence[str]) -> Option | None:
    """Step 3 without a free slot: the loading copy to queue at.

    Candidates in order (preferred first), cheapest copy of each: the call converges on
    a model that is already coming instead of loading a second one.
    """
    for model in models:
        queues = [o for o in loading_options(rnd, model) if o.kind is OptionKind.QUEUE]
        if queues:
            return min(queues, key=Option.sort_key)
    return None


def or_a_copy_as_soon(rnd: Round, choices: list[Option]) -> list[Option]:
    """``choices`` (a cheap case), or a cold load that starts the call no later.

    When every choice is a copy still loading, joining it gains the call nothing over
    loading another copy on a card that is free now and would finish as soon (calls
    issued in one instant: a burst, agents selected together). If other calls for the
    model are expected, the second copy shortens their waits and costs this one
    nothing, so it is taken: DESIGN §5's "company may pay for a second copy", at no
    price to the call. Alone, the call joins the coming copy as before. Only a load
    onto free room counts (nothing is evicted for it), and it must be ready no later
    than the soonest loading choice, the card's loads under way and the prefill
    included (long-discussion cut: 6.53 s → 3.13 s, three copies at once instead of
    one).
    """
    if not choices or any(o.kind is not _LOADING for o in choices):
        return choices
    model = choices[0].model
    cost = rnd.cost
    others = max(cost.demand.of(model).demand_besides_one_waiter,
                 float(cost.queued_ahead.get(model, 0)))
    load = cost.load(model)
    if others <= 0 or load is None:
        return choices
    soonest = min(o.seconds for o in choices)
    for option in cold_options(rnd, model, limit=cost.settings.copy_shortlist):
        if _holds_up_the_only_card(rnd, option):
            continue
        starts = cost.load_line_wait(rnd.provider_of(option)) + load
        starts = rnd.with_prefill(replace(option, seconds=starts)).seconds
        if starts <= soonest + AS_SOON_SECONDS:
            return [option]
    return choices


def _holds_up_the_only_card(rnd: Round, option: Option) -> bool:
    """Whether a copy as soon at ``option`` would make a known model without a copy
    wait for it on the one card that can take that model.

    Such a copy is a gamble for the company, taken because it costs the call nothing.
    A card loads one model at a time, so while it loads, a model that only this card
    can take (no other card has room for it, nor could make room by unloading idle
    models) waits for that load to end, and nobody can take that back. When the copy
    would leave no room for that model at all the gamble is still taken: an idle copy
    can be unloaded again, and the unload plans price that (fleet-16 cut: the plans at
    selection loaded `qwen3:32b` on the only card that could take `llama3.1:70b`,
    selected 1.5 s later, whose first calls then waited 61 s).
    """
    index = rnd.fleet.index
    p = rnd.provider_of(option)
    left = (p.free_mib or 0) - option.footprint_mib
    for model, mib in rnd.cost.occupancy_book.known().items():
        if mib > left or index.copies_of(model):
            continue
        rooms = list(itertools.islice(index.with_room(mib), 2))
        if len(rooms) != 1 or rooms[0].name != p.name:
            continue
        if not any(
            other.name != p.name
            and (other.free_mib or 0) + sum(idle_residents(other).values()) >= mib
            for other in rnd.fleet.providers
        ):
            return True
    return False


#: Within this much, a new copy is as soon as one loading (rounding, not a trade-off).
AS_SOON_SECONDS = 1e-6


# -- loads ----------------------------------------------------------------------------


def cold_options(rnd: Round, model: str, *, limit: int | None = None) -> list[Option]:
    """Loads of ``model`` onto free room, on providers where it has no copy.

    With ``limit`` only that many of the tightest fits are listed, found through the
    room index: every cold load of a model costs the same load time plus the best-fit
    term, which grows with the hole left, plus the slot-aware crowding term. A looser
    fit can only win on crowding, so the scan goes on past ``limit`` until some listed
    load crowds nothing. Without ``limit`` every provider is judged and its gates
    recorded (for an explanation).
    """
    occupancy = rnd.cost.occupancy(model)
    if limit is not None:
        if occupancy is None:
            return []
        providers: Iterable[ProviderSnapshot] = rnd.fleet.index.with_room(occupancy)
    else:
        providers = rnd.fleet.providers
    options: list[Option] = []
    uncrowded = False
    for p in providers:
        if p.has_copy(model):
            continue
        gates = filters.cold_gates(
            p, model, occupancy=occupancy, usable=p.usable_mib,
            resident=p.resident_total + p.loading_mib, prompt_tokens=rnd.prompt_tokens,
        )
        if rnd.record(p.name, model, gates) and occupancy is not None:
            option = rnd.with_prefill(rnd.cost.cold_option(p, model, occupancy))
            options.append(option)
            uncrowded = uncrowded or rnd.cost.crowding(p, model, occupancy) == 0
            if limit is not None and len(options) >= limit and uncrowded:
                break
    return sorted(options, key=Option.sort_key)


def unload_options(rnd: Round, model: str) -> list[Option]:
    """Per provider that could hold ``model`` once idle residents leave, its plan.

    Where the model's own copy is lapsing (``ProviderSnapshot.lapsing_mib``), the load
    counts that copy's memory as its own; when that is room enough, the plan is a cold
    load that takes the copy's place, with no victims (the room index, which lists cold
    loads, counts the copy's memory as taken).
    """
    occupancy = rnd.cost.occupancy(model)
    if occupancy is None:
        return []
    planner = EvictionPlanner(rnd.cost.demand)
    options: list[Option] = []
    for p in rnd.fleet.providers:
        usable, free = p.usable_mib, p.free_mib
        if usable is None or free is None or free >= occupancy or occupancy > usable:
            continue  # a cold load needs no victims; a too-small card no plan
        if p.has_copy(model):
            continue
        free += p.lapsing_mib(model)
        gates = [
            filters.ready_gate(p),
            filters.circuit_gate(p),
            filters.disk_gate(p, model),
            filters.context_gate(p, model, rnd.prompt_tokens),
        ]
        if not filters.feasible(gates):
            rnd.gates[f"{p.name}/{model} (unload)"] = gates
            continue
        if free >= occupancy:  # in the place of its own lapsing copy
            rnd.gates[f"{p.name}/{model} (unload)"] = [*gates, GateResult.pass_(
                VICTIMS, "the model's own lapsing copy makes room", neededMiB=0)]
            options.append(rnd.with_prefill(rnd.cost.cold_option(p, model, occupancy)))
            continue
        needed = occupancy - free
        victims = planner.choose_victims(idle_residents(p, exclude=model), needed)
        if victims:
            gates.append(GateResult.pass_(
                VICTIMS, "idle residents make room", victims=list(victims), neededMiB=needed,
            ))
        else:
            gates.append(GateResult.fail(
                VICTIMS, "idle residents cannot make room (models with live work stay)",
                neededMiB=needed,
            ))
        rnd.gates[f"{p.name}/{model} (unload)"] = gates
        if victims:
            options.append(rnd.with_prefill(
                rnd.cost.unload_option(p, model, occupancy, victims)))
    return sorted(options, key=Option.sort_key)


# -- the one comparison ---------------------------------------------------------------


def comparison(rnd: Round, models: Sequence[str], *, explain: bool) -> list[Option]:
    """Every option of the one comparison (step 4), cheapest first.

    Queues at any usable copy of a tolerated model (priced with the calls behind them),
    cold loads of the preferred model onto free room, and the preferred model's unload
    plans. Once the preferred model has a copy, cold loads of the other tolerated
    models join them: the band of quality points is the promise (DESIGN §5, quality
    stays a gate), so when the preferred model's copies are full, loading an in-band
    candidate onto an idle card serves the overflow instead of queueing it (homelab:
    32b's overflow onto a 14b on the other card). The preferred model's first copy is
    never skipped for a lesser one that merely loads faster: before it has a copy, the
    band's cold loads are priced only when the preferred model has no free room
    anywhere, against its unload plans. A lesser model's unload plans are priced for
    the overflow only, and only those whose victims nobody waits for or has an intent
    on. Without ``explain``
    only options that can win are priced: a few tightest cold fits (all cold loads of
    a model cost the same load time), and unload plans only when nothing cheaper than
    their floor — load(M) plus one unload — was found.
    """
    preferred = models[0]
    limit = None if explain else rnd.cost.settings.copy_shortlist
    options = [  # the company multiplies the wait, not the call's own prefill
        rnd.with_prefill(rnd.cost.priced_queue(o)) for m in models
        for o in copy_options(rnd, m, free_slot=False, limit=limit, prefill=False)
    ]
    # A lesser model of the band is loaded for overflow once the preferred model has a
    # copy (warm or coming), or when the preferred model fits nowhere without evicting:
    # free room for a band model then competes with the unload plans, never with a
    # cold load of the preferred model (memory-tight: the 24b evicted a coder and its
    # calls waited 17 s while a 14b of their band could load beside it).
    cold = cold_options(rnd, preferred, limit=limit)
    options += cold
    if not cold or rnd.fleet.index.copies_of(preferred):
        options += [o for m in models[1:] for o in cold_options(rnd, m, limit=limit)]
    # Unload plans are the preferred model's, and for the overflow (as cold loads above)
    # the band's lesser models' too, whose plans may evict only models nobody waits for
    # or plans to call (memory-tight: a writer queued a minute for `gemma3:27b` while
    # `gemma3:12b`, in its band, could replace an idle model on another card).
    demand = rnd.cost.demand
    cheapest = min((o.seconds for o in options), default=None)
    for m in models if rnd.fleet.index.copies_of(preferred) else models[:1]:
        floor = rnd.cost.unload_floor(m)
        if explain or cheapest is None or floor is None or cheapest > floor:
            options += [o for o in unload_options(rnd, m) if m == preferred or not any(
                demand.of(v).waiters or demand.of(v).intents for v in o.victims)]
    return sorted(options, key=lambda o: o.sort_key(models))


def start_estimate(rnd: Round, models: Sequence[str]) -> float | None:
    """Seconds until a busy call could probably start: what ``Retry-After`` says.

    The soonest of: a slot for it on a usable copy of an acceptable model (the copy's
    remaining load included, :meth:`CostModel.copy_option`), and the end of work in
    flight on a ready card that could hold the preferred model (a call ends one latency
    after it starts, and it starts when its copy has loaded). An unload plan or a cold
    load priced a moment ago is no such estimate: a call that could take one would have
    been placed. ``None`` when nothing in flight says (every card idle, down or shut off
    by its circuit). Held plans are not counted: no call runs on them yet.
    """
    cost, now = rnd.cost, rnd.fleet.now
    occupancy = cost.occupancy(models[0])
    times: list[float] = []
    for p in rnd.fleet.providers:
        if not p.state.ready or p.circuit_open:
            continue
        for model in models:
            if p.has_copy(model) and filters.warm_ok(p, model, rnd.prompt_tokens):
                times.append(cost.copy_option(p, model).seconds)
        usable = p.usable_mib
        if occupancy is not None and usable is not None and usable < occupancy:
            continue  # its work ending frees nothing this call could use
        for t in p.tickets:
            if t.model in models or t.state is TicketState.HELD:
                continue  # a copy of an acceptable model was counted above
            loaded = cost.load_ends_at(p, t.model)
            starts = t.started_at if loaded is None else max(t.started_at, loaded)
            times.append(max(0.0, starts + p.latency_seconds - now))
    return min(times) if times else None


def second_copy_pays(cost: CostModel, loading: Option, options: Sequence[Option]) -> bool:
    """Whether other calls' expected waits pay for another copy than the one loading.

    Step 3 keeps a call from loading a *second model* while a candidate is on its way,
    and a call alone always converges on the coming copy. When other calls want the
    same model too (:meth:`CostModel.priced_queue` raises the queue's price), the one
    comparison decides, and its cheapest option may be a load of any model of the band
    (DESIGN §5: once the preferred model has a copy, the band's lesser models may be
    loaded for the overflow). Letting only a second copy of the loading model compete
    kept a fan-out burst queued behind one coming copy while a smaller in-band model
    could load on an idle card (burst-fanout cut: 11.42 s → 8.44 s mean wait).
    """
    best = options[0] if options else None
    return (best is not None
            and best.kind in (OptionKind.COLD_LOAD, OptionKind.UNLOAD)
            and cost.priced_queue(loading).seconds > loading.seconds)


def could_help(
    fleet: FleetSnapshot,
    models: Sequence[str],
    changed: frozenset[str],
    *,
    best: float,
    occupancy: int | None,
    settings: RuntimeSettings,
    smallest_mib: int | None = None,
) -> bool:
    """Whether a change on ``changed`` providers can beat a queue that costs ``best``.

    A queued call gains from a slot or copy of a model it accepts, from room to load
    a model it accepts when the queue costs more than that load (``smallest_mib``: the
    smallest of them, which needs the least room and loads fastest; by default the
    preferred model's ``occupancy``), and from a card that could take the preferred
    model after unloads when the queue costs more than the cheapest possible unload
    plan. Nothing else can give it a better option.
    """
    if not changed:
        return False
    if occupancy is None:
        return True  # nothing to judge the room by
    room = occupancy if smallest_mib is None else min(occupancy, smallest_mib)
    load = load_seconds(room, settings)
    unload_floor = unload_floor_seconds(occupancy, settings)
    for name in changed:
        p = fleet.provider(name)
        if p is None:
            continue
        if any(p.has_copy(m) for m in models):
            return True
        usable, free = p.usable_mib, p.free_mib
        if best > load and free is not None and free >= room:
            return True
        if best > unload_floor and usable is not None and usable >= occupancy:
            return True
    return False
