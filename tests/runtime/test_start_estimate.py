"""options.start_estimate: when a busy call could probably start (the gateway's
``Retry-After``), on a manual clock where the remaining load time is known.

Load rate 1024 MiB/s (the default), so a 16 GiB load takes 16 s; the card's calls take
5 s (its observed latency).
"""

from __future__ import annotations

import pytest

from kubemoot.runtime import options
from kubemoot.runtime.placement import Action
from kubemoot.store.documents import TicketState
from kubemoot.testing.state import gpu, ticket


async def test_a_call_that_must_wait_for_another_models_load_and_call(make) -> None:
    # 23 GiB usable: x (4 GiB, idle) resident, z (16 GiB) loading for 3 of its 16 s. y
    # (12 GiB) fits neither beside them nor by unloading x, so it waits for z's call:
    # 13 s of load left, then 5 s of call.
    h = await make(
        [gpu("a", 24, residents={"x": 4})], declared={"y": 12},
        tickets={"a": [ticket("z", age=3, state=TicketState.LOADING, footprint_gib=16)]},
        latency={"a": 5},
    )
    placement = await h.place("y")
    assert placement.action is Action.WAIT and placement.options == ()
    rnd = await h.planner.new_round(None)
    assert options.start_estimate(rnd, ["y"]) == pytest.approx(13 + 5)


async def test_a_copy_still_loading_counts_its_remaining_load(make) -> None:
    # y is loading on a one-slot card for 2 of its 12 s, and the loader's call has the
    # slot: 10 s of load, then 5 s until that call is done.
    h = await make(
        [gpu("a", 24, slots=1)], declared={"y": 12},
        tickets={"a": [ticket("y", age=2, state=TicketState.LOADING, footprint_gib=12)]},
        latency={"a": 5},
    )
    rnd = await h.planner.new_round(None)
    assert options.start_estimate(rnd, ["y"]) == pytest.approx(10 + 5)


async def test_nothing_in_flight_says_nothing(make) -> None:
    h = await make([gpu("a", 24, residents={"x": 20})], declared={"y": 12})
    rnd = await h.planner.new_round(None)
    assert options.start_estimate(rnd, ["y"]) is None


async def test_work_on_a_card_too_small_for_the_model_is_not_counted(make) -> None:
    h = await make(
        [gpu("small", 8), gpu("big", 24, residents={"x": 20})], declared={"y": 12},
        tickets={"small": [ticket("w", age=0)], "big": [ticket("x", age=1)]},
        latency={"small": 2, "big": 9},
    )
    rnd = await h.planner.new_round(None)
    assert options.start_estimate(rnd, ["y"]) == pytest.approx(8)  # big's call, not small's
