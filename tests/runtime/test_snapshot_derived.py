"""A provider snapshot's derived values, worked out on first use, in any order.

:class:`ProviderSnapshot` derives its memory arithmetic and per-model facts lazily, in
groups. Whatever question is asked first, each answer must be what the DESIGN §5
arithmetic says of the documents; the reference below restates it plainly from the
state and tickets, and the property asks the snapshot its questions in a drawn order.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.store.documents import Ticket, TicketState
from kubemoot.testing.state import NOW, provider_state, ticket

MODELS = ("m", "n", "o")


@st.composite
def _snapshots(draw: st.DrawFn) -> ProviderSnapshot:
    residents = draw(st.dictionaries(st.sampled_from(MODELS), st.integers(1, 20_000),
                                     max_size=3))
    state = provider_state(
        "p", usable_mib=draw(st.one_of(st.none(), st.integers(0, 60_000))),
        loaded=residents, slots=draw(st.integers(1, 4)),
    )
    tickets = tuple(
        ticket(
            draw(st.sampled_from(MODELS)),
            age=draw(st.floats(0, 300)),
            state=draw(st.sampled_from(list(TicketState))),
            footprint_mib=draw(st.sampled_from([0, 0, 1, 5_000, 20_000])),
            evicts={v: 1 for v in draw(st.sets(st.sampled_from(MODELS), max_size=2))},
            ident=f"t{i}",
        )
        for i in range(draw(st.integers(0, 5)))
    )
    return ProviderSnapshot(state=state, tickets=tickets)


def _expected(p: ProviderSnapshot, model: str) -> dict[str, object]:
    """The same facts, restated from the documents without the snapshot's groups."""
    residents: dict[str, int] = {}
    for loaded in p.state.loaded_models:
        residents[loaded.name] = residents.get(loaded.name, 0) + loaded.size_mib
    loading = sum(t.model_footprint_mib for t in p.tickets if t.model not in residents)
    usable = p.usable_mib
    mine = [t for t in p.tickets if t.model == model]
    sized = sorted((t for t in mine if t.model_footprint_mib > 0), key=lambda t: t.started_at)
    loaders: list[Ticket] = sized or sorted(
        (t for t in mine if t.state is TicketState.LOADING), key=lambda t: t.started_at
    )
    if model in residents:
        loaders = []
    calls = tuple(t for t in mine if t.state is not TicketState.HELD)
    return {
        "resident_total": sum(residents.values()),
        "loading_mib": loading,
        "free_mib": None if usable is None else usable - sum(residents.values()) - loading,
        "has_copy": model in residents or bool(loaders),
        "is_resident": model in residents,
        "planned_victims": frozenset(v for t in p.tickets for v in t.evicts),
        "in_flight": calls,
        "has_free_slot": len(calls) < p.slots,
        "first_call_started": min((t.started_at for t in calls), default=None),
        "loading_tickets": loaders,
        "load_started": loaders[0].started_at if loaders else None,
        "load_mib": (loaders[0].model_footprint_mib
                     if loaders and loaders[0].model_footprint_mib > 0 else None),
        "headroom_mib": None if usable is None else (
            usable - sum(residents.values()) - loading
            + sum(residents[v] for v in {v for t in p.tickets for v in t.evicts}
                  if v in residents)
        ),
    }


_QUESTIONS = {
    "resident_total": lambda p, m: p.resident_total,
    "loading_mib": lambda p, m: p.loading_mib,
    "free_mib": lambda p, m: p.free_mib,
    "has_copy": lambda p, m: p.has_copy(m),
    "is_resident": lambda p, m: p.is_resident(m),
    "planned_victims": lambda p, m: p.planned_victims(),
    "in_flight": lambda p, m: p.in_flight(m),
    "has_free_slot": lambda p, m: p.has_free_slot(m),
    "first_call_started": lambda p, m: p.first_call_started(m),
    "loading_tickets": lambda p, m: p.loading_tickets(m),
    "load_started": lambda p, m: p.load_started(m),
    "load_mib": lambda p, m: p.load_mib(m),
    "headroom_mib": lambda p, m: p.headroom_mib(),
}


@settings(max_examples=300, deadline=None)
@given(p=_snapshots(), model=st.sampled_from(MODELS),
       order=st.permutations(sorted(_QUESTIONS)))
def test_every_derived_value_agrees_with_the_documents_whatever_is_asked_first(
    p: ProviderSnapshot, model: str, order: list[str]
) -> None:
    expected = _expected(p, model)
    for question in order:
        assert _QUESTIONS[question](p, model) == expected[question], question
    assert p.copies == frozenset(m for m in MODELS if _expected(p, m)["has_copy"])


def test_a_snapshot_is_a_value_equal_by_its_documents_and_never_changed() -> None:
    state = provider_state("p", usable_mib=20_000, loaded={"m": 8_000})
    tickets = (ticket("n", footprint_mib=4_000),)
    first = ProviderSnapshot(state=state, tickets=tickets)
    second = ProviderSnapshot(state=state, tickets=tickets)
    assert first.free_mib == 8_000  # derived on one, not on the other: still equal
    assert first == second
    assert first != ProviderSnapshot(state=state, tickets=tickets, circuit_open=True)
    with pytest.raises((AttributeError, FrozenInstanceError)):
        first.tickets = ()  # type: ignore[misc]
    assert NOW > 0


@settings(max_examples=100, deadline=None)
@given(earlier=_snapshots(), later=_snapshots(), model=st.sampled_from(MODELS))
def test_a_rebuilt_snapshot_shares_only_a_residency_of_the_same_state(
    earlier: ProviderSnapshot, later: ProviderSnapshot, model: str
) -> None:
    assert earlier.resident_total >= 0  # worked out on the earlier one
    same_state = ProviderSnapshot(state=earlier.state, tickets=later.tickets,
                                  latency_seconds=2.0).sharing_residency(earlier)
    other_state = ProviderSnapshot(state=later.state,
                                   tickets=later.tickets).sharing_residency(earlier)
    for rebuilt in (same_state, other_state):
        expected = _expected(rebuilt, model)
        for question, ask in _QUESTIONS.items():
            assert ask(rebuilt, model) == expected[question], question
