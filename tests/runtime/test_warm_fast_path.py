"""The warm fast path (``filters.warm_ok``) says what the warm gates say, on every snapshot.

``warm_ok`` restates ``feasible(warm_gates(...))`` without building evidence, for the hot
path. Two codings of one rule drift apart silently unless a test holds them together:
the property below generates fleets (contexts published or not, per-copy contexts,
prompts, slots, readiness, circuits, tickets that plan to unload, tickets expired at the
snapshot's time) and compares the two on each. The scenarios after it show what a
drifted fast path would do to a call.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kubemoot.runtime import filters
from kubemoot.runtime.placement import Action
from kubemoot.runtime.refusals import Reason
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.store.documents import TicketState
from kubemoot.testing.state import NOW, gpu, provider_state, ticket

MODELS = ("m", "n", "o")

_CONTEXTS = (512, 1024, 4096, 8192)
_contexts = st.one_of(st.none(), st.sampled_from(_CONTEXTS))
#: prompts on and beside every context a fleet can have, and anything else
_prompts = st.one_of(
    st.none(),
    st.sampled_from([c + d for c in _CONTEXTS for d in (-1, 0, 1)]),
    st.integers(1, 10_000),
)


@st.composite
def _snapshots(draw: st.DrawFn) -> ProviderSnapshot:
    residents = draw(st.dictionaries(st.sampled_from(MODELS), st.integers(1, 20_000),
                                     max_size=3))
    state = provider_state(
        "p",
        usable_mib=draw(st.one_of(st.none(), st.integers(0, 40_000))),
        loaded=residents,
        loaded_context={m: c for m in residents if (c := draw(_contexts)) is not None},
        ready=draw(st.booleans()),
        reason=draw(st.one_of(st.none(), st.just("connection refused"))),
        slots=draw(st.integers(1, 4)),
        context=draw(_contexts),
    )
    tickets = tuple(
        ticket(
            draw(st.sampled_from(MODELS)),
            age=draw(st.floats(0, 300)),
            state=draw(st.sampled_from(list(TicketState))),
            footprint_mib=draw(st.integers(0, 20_000)),
            evicts={v: 1 for v in draw(st.sets(st.sampled_from(MODELS), max_size=2))},
            ident=f"t{i}",
            # a short TTL makes some tickets expired at NOW: they must not count
            ttl_seconds=draw(st.sampled_from([1.0, 180.0])),
        )
        for i in range(draw(st.integers(0, 4)))
    )
    snapshot = ProviderSnapshot.of_documents(state, tickets, NOW)
    assert snapshot is not None
    return ProviderSnapshot(state=snapshot.state, tickets=snapshot.tickets,
                            circuit_open=draw(st.booleans()))


def _warm(
    context: int, *, state_context: int | None = None, ready: bool = True,
    circuit_open: bool = False, unloading: bool = False,
) -> ProviderSnapshot:
    """A card with ``m`` warm at ``context``; optionally down, shut off, or planned away."""
    plans = (ticket("n", evicts={"m": 12}),) if unloading else ()
    return ProviderSnapshot(
        state=provider_state(
            "p", usable_mib=30_000, loaded={"m": 12_000}, loaded_context={"m": context},
            context=state_context, ready=ready,
        ),
        tickets=plans,
        circuit_open=circuit_open,
    )


@settings(max_examples=400, deadline=None)
@given(p=_snapshots(), model=st.sampled_from(MODELS), prompt=_prompts)
# the cases a drifted fast path got wrong once, whatever the generator draws
@example(p=_warm(1024), model="m", prompt=4000)
@example(p=_warm(1024), model="m", prompt=1024)
@example(p=_warm(1024), model="m", prompt=1025)
@example(p=_warm(1024, state_context=8192), model="m", prompt=4000)
@example(p=_warm(8192, ready=False), model="m", prompt=None)
@example(p=_warm(8192, circuit_open=True), model="m", prompt=None)
@example(p=_warm(8192, unloading=True), model="m", prompt=None)
def test_the_fast_path_agrees_with_the_warm_gates(
    p: ProviderSnapshot, model: str, prompt: int | None
) -> None:
    gates = filters.warm_gates(p, model, prompt)
    assert filters.warm_ok(p, model, prompt) is filters.feasible(gates), gates


async def test_a_prompt_larger_than_the_warm_copy_context_is_refused(make) -> None:
    """4,000 tokens on the only copy, loaded with a 1,024 context: no wait can help."""
    h = await make([gpu("a", 32, residents={"m": 12}, resident_context={"m": 1024})])

    placement = await h.place("m", prompt=4000)

    assert (placement.action, placement.reason) == (Action.REFUSE, Reason.PROMPT_TOO_LARGE)
    assert placement.ticket is None


async def test_a_prompt_too_large_for_the_warm_copy_loads_where_it_fits(make) -> None:
    """With a second card whose context holds the prompt, the call cold-loads there."""
    h = await make([
        gpu("a", 32, residents={"m": 12}, resident_context={"m": 1024}),
        gpu("b", 32, context=8192),
    ])

    placement = await h.place("m", prompt=4000)

    assert (placement.action, placement.provider) == (Action.COLD_LOAD, "b")
    assert placement.ticket is not None
    # the second time: the copy on b now counts as warm for the same prompt, a is still no use
    again = await h.place("m", prompt=4000, holder="me-again")
    assert (again.action, again.provider) in {(Action.LOADING, "b"), (Action.QUEUE, "b")}
