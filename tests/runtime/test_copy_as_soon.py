"""A copy as soon as the one loading: company takes it when it costs the call nothing.

Calls issued in one instant (a burst, agents selected together) find a copy whose load
has just started. Joining it or loading another copy on a free card starts the call at
the same moment; with other calls for the model expected, the second copy also serves
them (DESIGN §5, company may pay for a second copy), so it is taken. A call alone, or
one whose own copy would come later, joins as before.
"""

from __future__ import annotations

from typing import Any

from kubemoot.runtime.what_if import PlacementState
from tests.runtime.test_tie_order_and_loading_copies import ago, place, state

MODELS = [{"name": "qwen3:14b", "vramMiB": 12288}]


def _just_loading(demand: dict[str, Any], *, started: float = 0.0) -> PlacementState:
    # l-a started loading qwen3:14b ``started`` seconds ago for another call, with slots
    # to spare; c-b is empty and would load a copy in the same 12 s.
    return state([
        {"name": "l-a", "totalVramMiB": 24576, "maxParallel": 4,
         "tickets": [{"model": "qwen3:14b", "state": "loading", "startedAt": ago(started),
                      "footprintMiB": 12288}]},
        {"name": "c-b", "totalVramMiB": 24576, "maxParallel": 4},
    ], models=MODELS, demand=demand)


async def test_a_call_alone_joins_the_copy_being_loaded() -> None:
    out = await place(_just_loading({}), "qwen3:14b")
    assert (out["action"], out["provider"]) == ("loading", "l-a")


async def test_with_company_a_second_copy_as_soon_is_loaded() -> None:
    out = await place(_just_loading({"qwen3:14b": {"intents": 2}}), "qwen3:14b")
    assert (out["action"], out["provider"]) == ("cold-load", "c-b")


async def test_a_copy_that_would_come_later_is_not_loaded_for_the_company() -> None:
    # 3 s into the load: the copy on l-a is ready 3 s before one loaded now on c-b.
    out = await place(_just_loading({"qwen3:14b": {"intents": 2}}, started=3), "qwen3:14b")
    assert (out["action"], out["provider"]) == ("loading", "l-a")


async def test_nothing_is_evicted_for_a_copy_as_soon() -> None:
    # c-b is full of an idle model: a second copy there needs an unload, so it is no
    # copy "as soon" (the unload alone takes a second).
    doc = _just_loading({"qwen3:14b": {"intents": 2}}).model_dump(by_alias=True, mode="json")
    doc["providers"][1]["residents"] = [{"model": "other", "sizeMiB": 20480}]
    doc["models"].append({"name": "other", "vramMiB": 20480})
    out = await place(PlacementState.model_validate(doc), "qwen3:14b")
    assert (out["action"], out["provider"]) == ("loading", "l-a")
