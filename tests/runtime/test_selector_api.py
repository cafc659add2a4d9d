"""`ProviderSelector.queue_option` and `pick_and_claim`, the selector calls issue 5 names."""

from __future__ import annotations

import pytest

from kubemoot.runtime.cost import OptionKind
from kubemoot.store.documents import TicketState
from kubemoot.testing.state import gpu, ticket


async def test_queue_option_is_the_soonest_busy_copy(make) -> None:
    h = await make(
        [gpu("a", 24, residents={"qwen3:14b": 12}), gpu("b", 24, residents={"qwen3:14b": 12})],
        tickets={"a": [ticket("qwen3:14b", age=5)], "b": [ticket("qwen3:14b", age=15)]},
        latency={"a": 20, "b": 20},
    )
    rnd = await h.planner.new_round(None)
    option = h.planner.selector.queue_option(rnd, ["qwen3:14b"])
    assert option is not None and option.kind is OptionKind.QUEUE
    # b's call is 15 s into a 20 s call: it frees in 5 s; a's in 15 s.
    assert (option.provider, option.seconds) == ("b", pytest.approx(5.0, abs=1e-6))


async def test_queue_option_is_none_when_a_copy_has_a_free_slot_or_none_exists(make) -> None:
    h = await make([gpu("a", 24, residents={"qwen3:14b": 12}, slots=2)],
                   tickets={"a": [ticket("qwen3:14b", age=5)]})
    rnd = await h.planner.new_round(None)
    assert h.planner.selector.queue_option(rnd, ["qwen3:14b"]) is None  # a slot is free
    assert h.planner.selector.queue_option(rnd, ["qwen3:8b"]) is None  # no copy at all


async def test_pick_and_claim_cold_loads_onto_the_tightest_fit(make) -> None:
    h = await make([gpu("big", 48), gpu("small", 16)], declared={"qwen3:8b": 8})
    rnd = await h.planner.new_round(None)
    claim = await h.planner.selector.pick_and_claim(rnd, "qwen3:8b", "agent-1")
    assert claim is not None
    (held,) = await h.active("small")
    assert held.model == "qwen3:8b" and held.state is TicketState.LOADING
    assert held.model_footprint_mib == 8 * 1024
    assert await h.active("big") == []


async def test_pick_and_claim_returns_none_when_queueing_is_cheapest(make) -> None:
    # The only copy is busy for 5 more seconds; a cold load elsewhere would take 12 s.
    h = await make(
        [gpu("a", 24, residents={"qwen3:14b": 12}), gpu("b", 16)],
        tickets={"a": [ticket("qwen3:14b", age=15)]},
        latency={"a": 20},
        declared={"qwen3:14b": 12},
    )
    rnd = await h.planner.new_round(None)
    # The cold load is a real option here; it just costs more than the queue.
    cold = h.planner.selector.cold_options(rnd, "qwen3:14b")
    assert [(o.provider, round(o.seconds)) for o in cold] == [("b", 12)]
    assert await h.planner.selector.pick_and_claim(rnd, "qwen3:14b", "agent-1") is None
    assert await h.active("b") == []
