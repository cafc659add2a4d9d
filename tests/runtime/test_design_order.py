"""DESIGN §5's order: step 3 converges on a loading copy even without a free slot, and
equally cheap copies go to the one with fewer calls in flight before the name."""

from __future__ import annotations

from kubemoot.runtime.held_plans import HeldPlans
from kubemoot.runtime.placement import Action
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import SelectionEntry, TicketState
from kubemoot.store.keys import join_key
from kubemoot.testing.state import gpu, ticket
from tests.runtime.builders import candidates

LOADING_14B = ticket("qwen3:14b", age=1, state=TicketState.LOADING, footprint_gib=12)


async def test_step_3_queues_at_a_loading_copy_whose_slots_are_taken(make) -> None:
    # l-a is loading qwen3:14b for another call and has one slot, taken by that call;
    # c-b could cold-load a second copy sooner. The call converges on the loading copy.
    h = await make([gpu("l-a", 24, slots=1), gpu("c-b", 24)], declared={"qwen3:14b": 12},
                   tickets={"l-a": [LOADING_14B]})
    placed = await h.place("qwen3:14b")
    assert (placed.action, placed.provider, placed.model) == (Action.QUEUE, "l-a", "qwen3:14b")
    assert placed.ticket is None  # a queue decision claims nothing
    assert placed.options[0].provider == "l-a"  # the copy it queues at comes first
    assert await h.active("c-b") == []


async def test_step_3_converges_on_a_tolerated_candidate_being_loaded(make) -> None:
    h = await make([gpu("l-a", 24, slots=1), gpu("c-b", 24)],
                   declared={"qwen3:14b": 12, "qwen3:8b": 6},
                   tickets={"l-a": [LOADING_14B]})
    placed = await h.place(("qwen3:8b", 70), ("qwen3:14b", 65))
    assert (placed.action, placed.provider, placed.model) == (Action.QUEUE, "l-a", "qwen3:14b")


async def test_equally_cheap_warm_copies_go_to_the_one_with_fewer_calls_in_flight(make) -> None:
    busy = ticket("m", age=3, ident="busy")
    h = await make([gpu("p-a", 24, residents={"m": 8}, slots=2),
                    gpu("p-b", 24, residents={"m": 8}, slots=2)],
                   tickets={"p-a": [busy]})
    placed = await h.place("m")
    assert (placed.action, placed.provider) == (Action.WARM, "p-b")
    # With equal calls in flight, the provider name decides.
    placed = await h.place("m", holder="second")
    assert (placed.action, placed.provider) == (Action.WARM, "p-a")


async def test_the_forecast_uses_how_often_each_agent_is_selected(make) -> None:
    # crew/a takes part in every thread, crew/b in one of four: their forecasts differ.
    h = await make([gpu("g", 48)], declared={"m": 4, "n": 4},
                   settings=RuntimeSettings())
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)
    await plans.commit_to_thread("crew/b", "t1", candidates("n"))
    for thread in ("t1", "t2", "t3", "t4"):
        await plans.commit_to_thread("crew/a", thread, candidates("m"))
        await plans.close_thread(thread)

    async def frequency(agent: str) -> float:
        entry = await h.demand_bucket.get(join_key("sel", agent))
        assert entry is not None
        return SelectionEntry.from_json(entry.value).frequency

    assert await frequency("crew/a") == 1.0
    assert await frequency("crew/b") == 0.25
    demand = await h.board.snapshot()
    assert demand.of("n").prediction == 0.25 and demand.of("m").prediction == 1.0
