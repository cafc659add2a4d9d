"""A provider's calls in flight and first call per model, by list comprehension.

On a busy provider every claim and release builds its snapshot again, and each model's
calls in flight and first call were worked out by generators fed to tuple() and min(),
each resumed once per ticket. They are list comprehensions now. These tests compare the
result with the rules it replaced, written out here, over generated tickets, and count
the calls.
"""

from __future__ import annotations

import cProfile
import pstats

from hypothesis import given
from hypothesis import strategies as st

from kubemoot.runtime.snapshot import _Calls, _loaders
from kubemoot.store.documents import Ticket, TicketState
from kubemoot.testing.state import GIB, ticket

_STATES = (TicketState.RUNNING, TicketState.LOADING, TicketState.HELD)


def _reference(tickets: tuple[Ticket, ...], residents: dict[str, int]) -> tuple[object, ...]:
    """The grouping as 03646d6 worked it out."""
    by_model: dict[str, list[Ticket]] = {}
    for t in tickets:
        by_model.setdefault(t.model, []).append(t)
    loaders = {m: found for m, ts in by_model.items()
               if m not in residents and (found := _loaders(ts))}
    in_flight = {m: calls for m, ts in by_model.items()
                 if (calls := tuple(t for t in ts if t.state is not TicketState.HELD))}
    first_call = {m: min(t.started_at for t in calls) for m, calls in in_flight.items()}
    load_started = {m: ts[0].started_at for m, ts in loaders.items()}
    load_mib = {m: ts[0].model_footprint_mib for m, ts in loaders.items()
                if ts[0].model_footprint_mib > 0}
    return by_model, in_flight, first_call, load_started, load_mib


def _grouped(tickets: tuple[Ticket, ...], residents: dict[str, int]) -> tuple[object, ...]:
    calls = _Calls.of(tickets, residents)
    return calls.by_model, calls.in_flight, calls.first_call, calls.load_started, calls.load_mib


_tickets = st.lists(
    st.builds(
        lambda model, age, state, footprint, n: ticket(
            model, age=age, state=state, footprint_gib=footprint, ident=f"t{n}"),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([0.0, 1.0, 2.5, 7.0]),
        st.sampled_from(_STATES),
        st.sampled_from([0.0, 1.0, 4.0]),
        st.integers(0, 10_000),
    ),
    max_size=12,
).map(tuple)


@given(_tickets, st.sampled_from([{}, {"a": 4 * GIB}, {"a": GIB, "b": 2 * GIB}]))
def test_the_grouping_is_the_old_rules(tickets: tuple[Ticket, ...],
                                       residents: dict[str, int]) -> None:
    new, old = _grouped(tickets, residents), _reference(tickets, residents)
    assert new == old
    # the same order of models and of tickets, which later readers iterate in
    assert [list(d) for d in new] == [list(d) for d in old]  # type: ignore[call-overload]


def test_in_flight_and_first_call_resume_no_generator_per_ticket() -> None:
    tickets = tuple(ticket("m", age=float(n), ident=f"t{n}") for n in range(32))
    profile = cProfile.Profile()
    profile.enable()
    _Calls.of(tickets, {"m": 4 * GIB})
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    assert not any(name == "<genexpr>" for _f, _l, name in stats), list(stats)
    calls = sum(entry[1] for entry in stats.values())
    # 03646d6: 144 for these 32 tickets (two generators resumed per ticket); now 80,
    # the dict's setdefault and the list's append per ticket
    assert calls <= 84, calls
