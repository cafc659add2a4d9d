"""The warm case read off the index's sorted free copies lists what pricing every copy
one by one lists: the same options in the same order, with the same gate evidence."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.runtime import filters, options
from kubemoot.runtime.cost import Option
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.options import Round
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ProviderSnapshot
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import TicketState
from kubemoot.testing.state import NOW, gpu, ticket

MODELS = ("a", "b")
NAMES = [f"p{i}" for i in range(10)]
MOSTLY = st.sampled_from([True, True, True, False])


@st.composite
def _provider(draw: st.DrawFn, name: str) -> ProviderSnapshot:
    residents = draw(st.dictionaries(st.sampled_from(MODELS), st.integers(1, 8), max_size=2))
    loading = draw(st.lists(st.sampled_from(MODELS), max_size=1))
    running = draw(st.lists(st.sampled_from(MODELS), max_size=2))
    victims = draw(st.lists(st.sampled_from(MODELS), max_size=1))
    tickets = (
        tuple(ticket(m, footprint_gib=4, state=TicketState.LOADING, age=draw(st.floats(0, 30)),
                     ident=f"{name}-l{i}") for i, m in enumerate(loading))
        + tuple(ticket(m, ident=f"{name}-r{i}", age=draw(st.floats(0, 30)))
                for i, m in enumerate(running))
        + tuple(ticket("c", footprint_gib=1, evicts={v: 1}, state=TicketState.HELD,
                       ident=f"{name}-v{i}") for i, v in enumerate(victims))
    )
    state = gpu(name, 48, residents=residents, slots=draw(st.integers(1, 3)),
                ready=draw(MOSTLY), context=draw(st.sampled_from([None, 2048, 8192])),
                resident_context={m: 4096 for m in residents} if draw(st.booleans()) else None)
    return ProviderSnapshot(state=state, tickets=tickets, circuit_open=not draw(MOSTLY))


@st.composite
def _fleet(draw: st.DrawFn) -> FleetSnapshot:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=1, max_size=10))
    index = FleetSnapshot.of(NOW, [draw(_provider(n)) for n in names]).index
    # a derived index (as the view keeps it) must answer as a fresh one does
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=3)):
        index = index.replaced([draw(_provider(name))])
    return FleetSnapshot(NOW, index)


def _one_by_one(rnd: Round, model: str, limit: int) -> list[Option]:
    """Every usable copy with a free slot priced, sorted, cut (the plain definition)."""
    listed: list[Option] = []
    for p in rnd.fleet.index.copies_of(model):
        if not filters.warm_ok(p, model, rnd.prompt_tokens):
            rnd.record(p.name, model, filters.warm_gates(p, model, rnd.prompt_tokens))
            continue
        ahead = rnd.ahead_of(p.name, model)
        if p.has_free_slot(model, ahead=ahead):
            listed.append(rnd.with_prefill(rnd.copy_option(p, model, ahead)))
    listed.sort(key=Option.sort_key)
    del listed[limit:]
    for o in listed:
        p = rnd.provider_of(o)
        rnd.record(p.name, model, filters.warm_gates(p, model, rnd.prompt_tokens))
    return listed


def _round(fleet: FleetSnapshot, prompt: int | None, prefill: dict[tuple[str, str], float],
           ahead: dict[tuple[str, str], int]) -> Round:
    rnd = Round.of(fleet, DemandSnapshot(), settings=RuntimeSettings(),
                   occupancy=OccupancyBook(), prompt_tokens=prompt)
    rnd.prefill = dict(prefill)
    rnd.ahead = dict(ahead)
    return rnd


@settings(max_examples=150, deadline=None)
@given(
    fleet=_fleet(),
    model=st.sampled_from(MODELS),
    limit=st.integers(1, 4),
    prompt=st.sampled_from([None, 1000, 3000, 6000]),
    holder=st.sampled_from([None, *NAMES]),
    waiter=st.sampled_from([None, *NAMES]),
)
def test_the_indexed_warm_case_lists_what_pricing_every_copy_lists(
    fleet: FleetSnapshot, model: str, limit: int, prompt: int | None,
    holder: str | None, waiter: str | None,
) -> None:
    prefill = {("", ""): 2.0, (holder, model): 0.5} if holder else {}
    ahead = {(waiter, model): 1} if waiter else {}
    fast = _round(fleet, prompt, prefill, ahead)
    plain = _round(fleet, prompt, prefill, ahead)
    assert options.copy_options(fast, model, free_slot=True, limit=limit) == _one_by_one(
        plain, model, limit)
    assert list(fast.gates.items()) == list(plain.gates.items())


def test_the_second_call_sees_the_first_ones_slot_taken() -> None:
    # Three warm copies, one slot each; after a call lands on the first, the derived
    # index lists the other two, and after it ends the first comes back first.
    providers = [ProviderSnapshot(state=gpu(n, 48, residents={"a": 4})) for n in ("x", "y", "z")]
    index = FleetSnapshot.of(NOW, providers).index
    assert index.free_copies("a") == [(0, "x"), (0, "y"), (0, "z")]
    busy = ProviderSnapshot(state=gpu("x", 48, residents={"a": 4}), tickets=(ticket("a"),))
    index = index.replaced([busy])
    rnd = _round(FleetSnapshot(NOW, index), 1000, {}, {})
    assert [o.provider for o in options.warm_options(rnd, "a")] == ["y", "z"]
    index = index.replaced([providers[0]])
    rnd = _round(FleetSnapshot(NOW, index), 1000, {}, {})
    assert [o.provider for o in options.warm_options(rnd, "a")] == ["x", "y", "z"]
