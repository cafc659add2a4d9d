"""The fleet index and the following view: derived state must equal a fresh build."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.runtime.snapshot import FleetIndex, ProviderSnapshot, _FreeCopies
from kubemoot.store.documents import TicketState
from kubemoot.store.keys import encode_token
from kubemoot.testing.state import gpu, ticket
from kubemoot.testing.waiting import until_idle

MODELS = ("a", "b", "c")


@st.composite
def providers(draw: st.DrawFn) -> ProviderSnapshot:
    name = draw(st.sampled_from(["p0", "p1", "p2", "p3", "p4"]))
    total = draw(st.sampled_from([None, 16, 24, 48]))
    residents = draw(st.dictionaries(st.sampled_from(MODELS), st.integers(1, 8), max_size=2))
    loading = draw(st.lists(st.sampled_from(MODELS), max_size=2))
    running = draw(st.lists(st.sampled_from(MODELS), max_size=3))
    tickets = tuple(
        ticket(m, footprint_gib=4, state=TicketState.LOADING, ident=f"{name}-{i}")
        for i, m in enumerate(loading)
    ) + tuple(ticket(m, ident=f"{name}-r{i}") for i, m in enumerate(running))
    state = gpu(name, total, residents=residents, slots=draw(st.integers(1, 3)),
                ready=draw(st.booleans()), context=draw(st.sampled_from([None, 2048, 8192])))
    return ProviderSnapshot(state=state, tickets=tickets, circuit_open=draw(st.booleans()))


def _view(index: FleetIndex) -> tuple[object, ...]:
    return (
        tuple(p.name for p in index.providers),
        {m: [p.name for p in index.copies_of(m)] for m in MODELS},
        {mib: [p.name for p in index.with_room(mib)] for mib in (0, 4096, 20480)},
        # the warm case's sorted free copies, and the context a prompt is judged by
        {m: index.free_copies(m) for m in MODELS},
        {m: index.smallest_free_context(m) for m in MODELS},
    )


@settings(max_examples=40, deadline=None)
@given(
    first=st.lists(providers(), max_size=5),
    steps=st.lists(st.tuples(st.lists(providers(), max_size=3),
                             st.lists(st.sampled_from(["p0", "p1", "p9"]), max_size=2)),
                   max_size=4),
)
def test_a_derived_index_equals_a_fresh_build(
    first: list[ProviderSnapshot], steps: list[tuple[list[ProviderSnapshot], list[str]]]
) -> None:
    current = {p.name: p for p in first}
    index = FleetIndex.build(current.values())
    for changed, removed in steps:
        for name in removed:
            current.pop(name, None)
        for p in changed:
            current[p.name] = p
        # A provider both changed and removed in one step stays removed only if it was
        # not put back: apply removals first, then changes, as the view does.
        index = index.replaced(list(changed), [n for n in removed if n not in
                                                {p.name for p in changed}])
        assert _view(index) == _view(FleetIndex.build(current.values()))


async def test_a_following_view_sees_changes_without_being_told(make) -> None:
    h = await make([gpu("a", 24), gpu("b", 24)])
    assert await h.view.follow()
    before = await h.view.snapshot()
    generation = h.view.generation
    await h.states.put(encode_token("b"), gpu("b", 24, residents={"m": 8}).to_json())
    await until_idle()  # the watch delivered the change; nothing told the view
    after = await h.view.snapshot()
    assert before.provider("b") is not None and not before.provider("b").is_resident("m")
    b = after.provider("b")
    assert b is not None and b.is_resident("m")
    assert h.view.changed_since(generation) == frozenset({"b"})
    assert after.provider("a") is before.provider("a")  # unchanged providers are shared
    await h.view.close()
    assert not h.view.following


def test_a_claim_moves_only_the_lists_it_changes() -> None:
    # p0 holds a copy of "a" and of "b"; a call takes a slot on "a". The derived
    # index must share the parent's warm list of "b" (nothing about it moved) rather
    # than copy it, and still equal a fresh build.
    def p0(*tickets: object) -> ProviderSnapshot:
        return ProviderSnapshot(state=gpu("p0", 48, residents={"a": 4, "b": 4}, slots=2),
                                tickets=tuple(tickets))  # type: ignore[arg-type]

    others = [ProviderSnapshot(state=gpu("p1", 48, residents={"b": 4}, slots=2))]
    index = FleetIndex.build([p0(), *others])
    busy = p0(ticket("a", ident="call-1"))
    derived = index.replaced([busy])
    assert derived.free_copies("b") is index.free_copies("b")
    assert derived.free_copies("a") is not index.free_copies("a")
    assert _view(derived) == _view(FleetIndex.build([busy, *others]))


def test_a_snapshots_free_copies_are_worked_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each replacement asks for the entries of the snapshot it replaces, which the
    # index worked out when that snapshot came in: a snapshot never changes, so they
    # are kept on it, and a chain of replacements lists each snapshot once.
    listed: list[ProviderSnapshot] = []
    real = _FreeCopies._listed

    def counted(p: ProviderSnapshot) -> Iterator[tuple[str, int, int]]:
        listed.append(p)
        return real(p)

    monkeypatch.setattr(_FreeCopies, "_listed", staticmethod(counted))
    state = gpu("p0", 48, residents={"a": 4}, slots=2)
    snapshots = [ProviderSnapshot(state=state, tickets=tuple(
        ticket("a", ident=f"call-{i}") for i in range(n))) for n in (0, 1, 2, 1, 0)]
    index = FleetIndex.build(snapshots[:1])
    for snapshot in snapshots[1:]:
        index = index.replaced([snapshot])
    assert listed == snapshots
    assert _view(index) == _view(FleetIndex.build(snapshots[-1:]))
