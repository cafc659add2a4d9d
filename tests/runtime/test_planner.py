"""CallPlanner.place: the spec's order, its "what falls out" bullets, and eviction rules."""

from __future__ import annotations

import pytest

from kubemoot.runtime.cost import OptionKind
from kubemoot.runtime.placement import Action
from kubemoot.store.documents import TicketState
from kubemoot.store.keys import encode_token
from kubemoot.testing.state import gpu, ticket

# -- what falls out -------------------------------------------------------------------


async def test_warm_reuse_costs_nothing_and_wins_whatever_the_model_size(make) -> None:
    h = await make([gpu("big", 48, residents={"llama:70b": 40}), gpu("idle", 48)])
    placement = await h.place("llama:70b")
    assert placement.action is Action.WARM
    assert placement.provider == "big"
    assert placement.ticket is not None and placement.ticket.model_footprint_mib == 0
    warm = next(o for o in placement.options if o.provider == "big")
    assert warm.seconds == 0.0


async def test_a_short_queue_beats_duplicating_the_model(make) -> None:
    # One call 2 s into a 10 s call: 8 s to a slot, against a 12 s cold load elsewhere.
    h = await make(
        [gpu("home", 24, residents={"qwen3:14b": 12}), gpu("idle", 24)],
        tickets={"home": [ticket("qwen3:14b", age=2)]},
        latency={"home": 10},
    )
    placement = await h.place("qwen3:14b")
    assert placement.action is Action.QUEUE and placement.provider == "home"
    assert await h.active("idle") == []


async def test_a_long_queue_spreads_a_second_copy_onto_an_idle_card(make) -> None:
    queued = [ticket("qwen3:14b", age=2, ident=f"q{i}") for i in range(3)]
    h = await make(
        [gpu("home", 24, residents={"qwen3:14b": 12}), gpu("idle", 24)],
        tickets={"home": queued},
        latency={"home": 10},
    )
    placement = await h.place("qwen3:14b")
    assert placement.action is Action.COLD_LOAD and placement.provider == "idle"
    assert placement.ticket is not None
    assert placement.ticket.state is TicketState.LOADING
    assert placement.ticket.model_footprint_mib == 12 * 1024


async def test_a_cold_load_takes_free_room_before_evicting_anyone(make) -> None:
    h = await make(
        [gpu("full", 24, residents={"a:7b": 8, "b:7b": 8}), gpu("empty", 24)],
        declared={"qwen3:14b": 12},
    )
    placement = await h.place("qwen3:14b")
    assert placement.action is Action.COLD_LOAD and placement.provider == "empty"
    assert placement.evicted == ()


async def test_a_model_with_live_work_is_never_evicted_at_any_price(make) -> None:
    # The only resident is busy; waiting is the only honest answer.
    h = await make(
        [gpu("only", 24, residents={"busy:14b": 20})],
        tickets={"only": [ticket("busy:14b", age=1)]},
        declared={"qwen3:8b": 8},
    )
    placement = await h.place("qwen3:8b")
    assert placement.action is Action.WAIT and placement.reason == "gpu-busy"
    assert all(o.kind is not OptionKind.UNLOAD for o in placement.options)


async def test_cold_loads_best_fit_keeps_big_holes_whole(make) -> None:
    h = await make([gpu("huge", 80), gpu("snug", 16)], declared={"qwen3:8b": 8})
    placement = await h.place("qwen3:8b")
    assert placement.provider == "snug"
    costs = {o.provider: o.seconds for o in placement.options}
    assert costs["snug"] == pytest.approx(8 + 0.001 * (15 - 8), abs=1e-9)
    assert costs["huge"] == pytest.approx(8 + 0.001 * (79 - 8), abs=1e-9)


async def test_distinct_models_partition_and_one_model_concentrates(make) -> None:
    h = await make([gpu("a", 24, slots=4), gpu("b", 24, slots=4)],
                   declared={"m1": 14, "m2": 14})
    first = await h.place("m1", holder="x")
    second = await h.place("m2", holder="y")
    third = await h.place("m1", holder="z")
    assert {first.provider, second.provider} == {"a", "b"}
    # The second m1 call converges on the copy the first call is loading.
    assert third.provider == first.provider and third.action is Action.LOADING


# -- candidates ------------------------------------------------------------------------


async def test_warm_in_tolerance_candidate_beats_cold_loading_the_preferred(make) -> None:
    h = await make([gpu("a", 24, residents={"qwen3:14b": 12}), gpu("b", 24)],
                   declared={"qwen3:32b": 20})
    placement = await h.place(("qwen3:32b", 70), ("qwen3:14b", 60))
    assert placement.action is Action.WARM
    assert (placement.provider, placement.model) == ("a", "qwen3:14b")


async def test_candidate_outside_tolerance_is_not_used(make) -> None:
    h = await make([gpu("a", 24, residents={"qwen3:8b": 6}), gpu("b", 24)],
                   declared={"qwen3:32b": 20})
    placement = await h.place(("qwen3:32b", 70), ("qwen3:8b", 30))
    assert (placement.action, placement.model) == (Action.COLD_LOAD, "qwen3:32b")


async def test_a_call_converges_on_a_copy_another_call_is_loading(make) -> None:
    h = await make(
        [gpu("a", 24, slots=2), gpu("b", 24)],
        tickets={"a": [ticket("qwen3:14b", age=4, state=TicketState.LOADING,
                                footprint_gib=12)]},
        declared={"qwen3:14b": 12},
    )
    placement = await h.place("qwen3:14b")
    assert (placement.action, placement.provider) == (Action.LOADING, "a")
    assert placement.ticket is not None and placement.ticket.model_footprint_mib == 0


async def test_a_copy_planned_for_unload_does_not_count_as_warm(make) -> None:
    h = await make(
        [gpu("a", 24, residents={"qwen3:8b": 8}), gpu("b", 24)],
        tickets={"a": [ticket("other:14b", state=TicketState.LOADING, footprint_gib=14,
                                evicts={"qwen3:8b": 8})]},
    )
    placement = await h.place("qwen3:8b")
    assert (placement.action, placement.provider) == (Action.COLD_LOAD, "b")
    # the gate says why "a" was passed over
    assert placement.decision is not None
    assert placement.decision.candidates["a/qwen3:8b"].failures[0].gate == "warm"


# -- victims ---------------------------------------------------------------------------


async def test_fewest_victims_win(make) -> None:
    h = await make([gpu("a", 25, residents={"s1": 6, "s2": 6, "big": 12})],
                   declared={"new": 12})
    placement = await h.place("new")
    assert placement.evicted == ("big",)


@pytest.mark.parametrize(
    ("needs", "victim"),
    [
        ({"x": "wait", "y": ""}, "y"),
        ({"x": "intent", "y": ""}, "y"),
        ({"x": "use", "y": ""}, "y"),
        ({"x": "intent", "y": "use"}, "y"),
        ({"x": "wait", "y": "intent"}, "y"),
    ],
)
async def test_least_needed_goes_first(make, needs: dict[str, str], victim: str) -> None:
    h = await make([gpu("a", 17, residents={"x": 8, "y": 8})], declared={"new": 8})
    for model, need in needs.items():
        if need == "wait":
            await h.board.add_waiter(model, "crew/agent")
        elif need == "intent":
            await h.board.add_intent(model, "crew/agent")
        elif need == "use":
            await h.board.record_use(model)
    placement = await h.place("new")
    assert placement.evicted == (victim,)


async def test_a_victim_with_an_in_flight_ticket_is_never_chosen(make) -> None:
    # "cheap" would be the least needed, but it is serving a call right now.
    h = await make(
        [gpu("a", 25, residents={"cheap": 12, "wanted": 12})],
        tickets={"a": [ticket("cheap", age=1)]},
        declared={"new": 12},
    )
    for _ in range(5):
        await h.board.record_use("wanted")
    placement = await h.place("new")
    assert placement.evicted == ("wanted",)


async def test_a_pinned_copy_is_never_a_victim(make) -> None:
    # "pinned" is the least needed and alone frees enough; it is pinned to a, so the
    # planner takes the wanted one instead.
    state = gpu("a", 25, residents={"pinned": 12, "wanted": 12})
    state.pinned = ["pinned"]
    h = await make([state], declared={"new": 12})
    for _ in range(5):
        await h.board.record_use("wanted")
    placement = await h.place("new")
    assert placement.evicted == ("wanted",)


@pytest.mark.parametrize("pinned", [True, False])
async def test_a_load_that_needs_the_pinned_copy_gone_is_not_placed(
        make, pinned: bool) -> None:
    state = gpu("a", 25, residents={"kept": 12})
    state.pinned = ["kept"] if pinned else []
    h = await make([state], declared={"huge": 20})
    placement = await h.place("huge")
    assert placement.placed is not pinned
    assert placement.evicted == (() if pinned else ("kept",))


async def test_models_with_waiters_are_evicted_only_when_nothing_else_makes_room(make) -> None:
    # Freeing 12 GiB takes either the waited-for model alone or both others.
    h = await make([gpu("a", 29, residents={"waited": 12, "p": 8, "q": 8})],
                   declared={"new": 12})
    await h.board.add_waiter("waited", "crew/agent")
    placement = await h.place("new")
    assert set(placement.evicted) == {"p", "q"}


async def test_a_queued_call_takes_a_ticket_on_the_copy_it_queues_at(make) -> None:
    # The agent runtime's queue path: sharing the busy copy spends no memory, and the
    # ticket makes the copy busy (never a victim) while the call waits there.
    h = await make(
        [gpu("a", 24, residents={"qwen3:14b": 12}), gpu("b", 12, residents={"other": 11})],
        tickets={"a": [ticket("qwen3:14b", age=5)]},
        latency={"a": 20},
    )
    queued = await h.place("qwen3:14b")
    assert (queued.action, queued.provider, queued.ticket) == (Action.QUEUE, "a", None)

    taken = await h.planner.take_queue(queued, "me", prompt_tokens=None)

    assert taken.ticket is not None and taken.ticket.model_footprint_mib == 0
    assert (taken.provider, taken.endpoint) == ("a", "http://a:11434")
    assert len(await h.active("a")) == 2

    # The copy went away meanwhile: nothing is taken, the queue decision stands.
    await h.set_state(gpu("a", 24))
    again = await h.planner.take_queue(queued, "me-too", prompt_tokens=None)
    assert again is queued
    # Its provider left the fleet: still the decision, not a LookupError.
    await h.states.delete(encode_token("a"))
    h.view.invalidate()
    assert await h.planner.take_queue(queued, "me-three", prompt_tokens=None) is queued
