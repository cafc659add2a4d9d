"""CallPlanner.place with providers excluded (a call refused there before sending).

An excluded provider is left out of the round before anything is priced; a refusal is
still judged on the whole fleet, so leaving out the one card that fits a model makes the
call wait (busy), never a "model too large" it is not.
"""

from __future__ import annotations

from kubemoot.runtime.placement import Action
from kubemoot.testing.state import gpu
from tests.runtime.builders import candidates


async def test_an_excluded_warm_copy_is_passed_over_for_a_cold_load(make) -> None:
    h = await make([gpu("warm", 24, residents={"qwen3:14b": 12}), gpu("idle", 24)])
    placement = await h.planner.place(candidates("qwen3:14b"), holder_id="me",
                                      exclude=("warm",))
    assert placement.action is Action.COLD_LOAD and placement.provider == "idle"
    assert all(o.provider != "warm" for o in placement.options)
    assert await h.active("warm") == []


async def test_with_the_only_card_that_fits_excluded_the_call_waits(make) -> None:
    h = await make([gpu("big", 48, residents={"llama:70b": 40}), gpu("small", 16)])
    placement = await h.planner.place(candidates("llama:70b"), holder_id="me",
                                      exclude=("big",))
    assert placement.action is Action.WAIT and placement.reason == "gpu-busy"
    assert placement.ticket is None
