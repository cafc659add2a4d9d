"""DESIGN §5's order: step 3 converges on a loading copy even without a free slot, and
equally cheap copies go to the one with fewer calls in flight before the name."""

from __future__ import annotations

from kubemoot.runtime.demand import FORECAST_REFRESH_SECONDS, DemandBoard
from kubemoot.runtime.held_plans import SHARE_TOLERANCE, HeldPlans
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


async def test_another_process_s_forecast_shows_once_the_forecast_is_read_again(make) -> None:
    # The forecast is read from the board every FORECAST_REFRESH_SECONDS; this process's
    # own selections show at once, another process's at the next reading.
    h = await make([gpu("g", 48)], declared={"m": 4, "n": 4}, settings=RuntimeSettings())
    await h.board.record_selection("crew/a", ["m"], 1.0)
    assert (await h.board.snapshot()).of("m").prediction == 1.0
    other = DemandBoard(h.demand_bucket, clock=h.clock)  # another process's board
    await other.record_selection("crew/b", ["n"], 0.5)
    await h.board.record_selection("crew/a", ["m"], 0.5)  # own: replaces its 1.0 at once
    seen = await h.board.snapshot()
    assert seen.of("m").prediction == 0.5 and seen.of("n").prediction == 0.0
    h.clock.advance(FORECAST_REFRESH_SECONDS)
    seen = await h.board.snapshot()
    assert seen.of("m").prediction == 0.5 and seen.of("n").prediction == 0.5


async def test_a_new_thread_rewrites_only_the_shares_that_moved(make) -> None:
    # Ten threads select crew/a; crew/b was in the first only. Each new thread lowers
    # crew/b's share (1/2, 1/3, ...); its entry is written again only once the share
    # has moved by more than SHARE_TOLERANCE of what the board holds.
    h = await make([gpu("g", 48)], declared={"m": 4, "n": 4}, settings=RuntimeSettings())
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)
    await plans.commit_to_thread("crew/b", "t0", candidates("n"))
    written: list[float] = []
    for k in range(10):
        await plans.commit_to_thread("crew/a", f"t{k}", candidates("m"))
        await plans.close_thread(f"t{k}")
        entry = await h.demand_bucket.get(join_key("sel", "crew/b"))
        assert entry is not None
        written.append(SelectionEntry.from_json(entry.value).frequency)
    assert plans.frequency("crew/b") == 0.1
    # every share on the board is within the tolerance of the true one, or was rewritten
    for k, share in enumerate(written):
        true = 1 / (k + 1)
        assert abs(share - true) <= SHARE_TOLERANCE * share
    assert len(set(written)) < len(written)  # some threads wrote nothing for crew/b


async def test_shares_written_after_old_threads_leave_the_window(make) -> None:
    # crew/b was selected early and again later; its old threads leave the selection
    # window, crew/c's only one too (crew/c is forgotten). Every share written on a
    # new thread is the agent's frequency as the window holds it then.
    h = await make([gpu("g", 48)], declared={"m": 4, "n": 4},
                   settings=RuntimeSettings(selection_window_seconds=100.0))
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)

    async def written(agent: str) -> float:
        entry = await h.demand_bucket.get(join_key("sel", agent))
        assert entry is not None
        return SelectionEntry.from_json(entry.value).frequency

    await plans.commit_to_thread("crew/c", "t0", candidates("n"))
    for k in range(6):
        await plans.commit_to_thread("crew/b", f"t{k}", candidates("n"))
        await plans.commit_to_thread("crew/a", f"t{k}", candidates("m"))
        h.clock.advance(30.0)
    # t0..t2 are older than 100 s now: b keeps t3..t5 of t3..t5, c is gone
    await plans.commit_to_thread("crew/a", "t6", candidates("m"))
    assert plans.frequency("crew/c") == 0.0 and plans.frequency("crew/b") == 0.75
    assert await written("crew/a") == 1.0
    b = await written("crew/b")
    assert abs(b - 0.75) <= SHARE_TOLERANCE * b
    h.clock.advance(95.0)  # t3..t5 leave as well: b is forgotten, then selected anew
    await plans.commit_to_thread("crew/b", "t7", candidates("n"))
    await plans.commit_to_thread("crew/a", "t8", candidates("m"))
    # t6, t7 and t8 are in the window: b's share moved from the 1/2 it wrote at t7
    assert plans.frequency("crew/b") == 1 / 3
    assert await written("crew/b") == 1 / 3
