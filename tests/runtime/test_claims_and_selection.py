"""Claim first then release, and plans held from selection."""

from __future__ import annotations

from kubemoot.runtime import options
from kubemoot.runtime.claims import Claims
from kubemoot.runtime.cost import OptionKind
from kubemoot.runtime.held_plans import HeldPlans
from kubemoot.runtime.placement import Action
from kubemoot.store.documents import TicketState
from kubemoot.store.keys import join_key
from kubemoot.testing.state import gpu, ticket
from tests.runtime.builders import candidates


async def test_a_victim_that_picks_up_a_call_meanwhile_voids_the_claim(make) -> None:
    h = await make([gpu("a", 17, residents={"victim": 16})], declared={"new": 8})
    rnd = await h.planner.new_round(None)
    plan = options.unload_options(rnd, "new")[0]
    assert plan.victims == ("victim",)
    # Between planning and claiming, another call starts on the victim.
    await h.set_tickets("a", [ticket("victim", ident="late-call")])

    claims = Claims(h.view, h.tickets, states=h.states, clients={})
    claim = await claims.claim(rnd, plan, "me", state=TicketState.RUNNING)

    assert claim is None
    assert [t.ticket_id for t in await h.active("a")] == ["late-call"]
    fleet = await h.view.snapshot()
    provider = fleet.provider("a")
    assert provider is not None and provider.is_resident("victim")  # nothing unloaded


async def test_the_cheaper_unload_plan_wins_across_providers(make) -> None:
    h = await make([gpu("a", 17, residents={"victim": 16}), gpu("b", 17, residents={"v2": 16})],
                   declared={"new": 8})
    await h.board.record_use("v2")  # "a" is the cheaper plan
    first = await h.place("new")
    assert first.evicted == ("victim",) and first.provider == "a"


async def test_two_planners_cannot_spend_one_victim_twice(make) -> None:
    h = await make([gpu("a", 17, residents={"victim": 16})], declared={"new": 8, "other": 8})
    rnd = await h.planner.new_round(None)
    plan_new = options.unload_options(rnd, "new")[0]
    plan_other = options.unload_options(rnd, "other")[0]
    # Claim both against the same (stale) round, without unloading in between.
    claims = Claims(h.view, h.tickets, states=h.states, clients={})
    first = await claims.claim_ticket(
        plan_new, "x", state=TicketState.LOADING, check=lambda _p: True
    )
    second = await claims.claim_ticket(
        plan_other, "y", state=TicketState.LOADING, check=lambda _p: True
    )
    assert first is not None
    # 16 GiB of credit holds 8 + 8 GiB: both fit; a third 8 GiB would not.
    assert second is not None
    third = await claims.claim_ticket(
        plan_other, "z", state=TicketState.LOADING, check=lambda _p: True
    )
    assert third is None


async def test_held_plan_lifecycle(make) -> None:
    # Card "a" cannot hold the 14b, so the second agent has no copy of its own to load
    # as soon as the held one (see the test after this one).
    h = await make([gpu("a", 12), gpu("b", 24, residents={"qwen3:8b": 6}, slots=2)],
                   declared={"qwen3:14b": 12})
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)

    placed = await plans.commit_to_thread(
        "crew/a", "t1", candidates(("qwen3:14b", 70), ("qwen3:8b", 30))
    )

    # A held ticket reserves the load; intents and the selection are on the board.
    assert placed.action is Action.COLD_LOAD and placed.ticket is not None
    assert placed.ticket.state is TicketState.HELD
    assert await h.demand_bucket.get(join_key("intent", "qwen3:14b", "crew/a")) is not None
    assert await h.demand_bucket.get(join_key("sel", "crew/a")) is not None
    demand = await h.board.snapshot()
    assert demand.of("qwen3:14b").intents == 1 and demand.of("qwen3:14b").prediction == 1.0

    # Another agent selected for the same thread converges on the held copy, whose
    # second slot no plan counts on yet.
    other = await plans.commit_to_thread("crew/b", "t1", candidates("qwen3:14b"))
    assert (other.action, other.provider) == (Action.LOADING, placed.provider)
    assert plans.planned() == {("b", "qwen3:14b"): 2}

    # The first mulling call takes the plan: same ticket, now loading.
    taken = await plans.take("crew/a", "t1", prompt_tokens=1000)
    assert taken is not None and taken.ticket is not None
    assert taken.ticket.ticket_id == placed.ticket.ticket_id
    assert taken.ticket.state is TicketState.LOADING
    assert await plans.take("crew/a", "t1") is None  # taken once
    assert plans.planned() == {("b", "qwen3:14b"): 1}  # its call holds a ticket now

    # Thread close releases what is still held, and the intents.
    await plans.close_thread("t1")
    assert plans.held("crew/b", "t1") is None
    left = {t.holder_id for t in await h.active(placed.provider or "")}
    assert left == {"crew/a@t1"}  # the taken plan is the call's to release
    assert await h.demand_bucket.get(join_key("intent", "qwen3:14b", "crew/b")) is None
    assert plans.planned() == {}


async def test_an_agent_selected_with_company_loads_a_copy_as_soon_as_the_held_one(
    make,
) -> None:
    # As in the lifecycle, but card "a" can hold the 14b: the second agent's plan could
    # join the copy loading on "b" (ready in 12 s) or load its own on "a", ready as
    # soon. The first agent's intent is company, so it loads: the calls of both agents
    # get a copy each, and neither waits longer.
    h = await make([gpu("a", 24), gpu("b", 24, residents={"qwen3:8b": 6}, slots=2)],
                   declared={"qwen3:14b": 12})
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)
    placed = await plans.commit_to_thread(
        "crew/a", "t1", candidates(("qwen3:14b", 70), ("qwen3:8b", 30)))
    assert (placed.action, placed.provider) == (Action.COLD_LOAD, "b")
    other = await plans.commit_to_thread("crew/b", "t1", candidates("qwen3:14b"))
    assert (other.action, other.provider) == (Action.COLD_LOAD, "a")
    assert other.ticket is not None and other.ticket.state is TicketState.HELD
    assert plans.planned() == {("b", "qwen3:14b"): 1, ("a", "qwen3:14b"): 1}


async def test_agents_selected_together_do_not_count_on_the_same_free_slot(make) -> None:
    # One warm copy with one free slot, and an idle card. The first agent's plan
    # shares the copy (nothing held); the second would queue behind that first call
    # (30 s latency prior) or load a copy of its own (12 s): it loads.
    h = await make([gpu("warm", 24, residents={"m": 12}), gpu("idle", 24)])
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)
    first = await plans.commit_to_thread("crew/a", "t1", candidates("m"))
    assert (first.action, first.provider, first.ticket) == (Action.WARM, "warm", None)
    second = await plans.commit_to_thread("crew/b", "t1", candidates("m"))
    assert (second.action, second.provider) == (Action.COLD_LOAD, "idle")
    assert second.ticket is not None and second.ticket.state is TicketState.HELD
    assert plans.planned() == {("warm", "m"): 1, ("idle", "m"): 1}


async def test_a_held_load_counts_its_first_call_on_the_coming_copy(make) -> None:
    # A held plan's ticket takes no slot (it is not a call yet); its first call will.
    # With one slot, the second agent selected does not join the coming copy's slot:
    # it loads a copy of its own.
    h = await make([gpu("a", 24), gpu("b", 24)], declared={"m": 12})
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)
    first = await plans.commit_to_thread("crew/a", "t1", candidates("m"))
    assert first.action is Action.COLD_LOAD
    second = await plans.commit_to_thread("crew/b", "t1", candidates("m"))
    assert second.action is Action.COLD_LOAD and second.provider != first.provider


async def test_a_plan_whose_first_call_never_comes_stops_counting_after_the_ttl(make) -> None:
    h = await make([gpu("warm", 24, residents={"m": 12})])
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)
    await plans.commit_to_thread("crew/a", "t1", candidates("m"))
    assert plans.planned() == {("warm", "m"): 1}
    h.clock.advance(180)
    await plans.expire()
    assert plans.planned() == {}


async def test_held_plan_released_on_stand_aside_and_after_three_minutes(make) -> None:
    h = await make([gpu("a", 24)], declared={"m": 12})
    plans = HeldPlans(h.planner, clock=h.clock, board=h.board)
    await plans.commit_to_thread("crew/a", "t1", candidates("m"))
    await plans.release("crew/a", "t1")  # stood aside
    assert await h.active("a") == []

    await plans.commit_to_thread("crew/a", "t2", candidates("m"))
    h.clock.advance(179)
    assert await plans.expire() == 0
    h.clock.advance(1)
    assert await plans.expire() == 1
    assert await h.active("a") == []


async def test_held_plan_on_a_provider_gone_unready_is_released(make) -> None:
    h = await make([gpu("a", 24)], declared={"m": 12})
    plans = HeldPlans(h.planner, clock=h.clock)
    await plans.commit_to_thread("crew/a", "t1", candidates("m"))
    await h.set_state(gpu("a", 24, ready=False))
    assert await plans.take("crew/a", "t1") is None
    assert await h.active("a") == []


async def test_queue_decision_claims_nothing_and_lists_the_copy(make) -> None:
    h = await make([gpu("a", 24, residents={"m": 12})], tickets={"a": [ticket("m", age=1)]})
    placement = await h.place("m")
    assert placement.action is Action.QUEUE and not placement.placed
    assert [o.kind for o in placement.options] == [OptionKind.QUEUE]
    assert len(await h.active("a")) == 1
