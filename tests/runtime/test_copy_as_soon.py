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


def _only_card_for_the_70b(*, big_mib: int = 44032, other: dict[str, Any] | None = None,
                           ) -> PlacementState:
    # l-a (48 GiB) has just started loading qwen3:32b for an agent selected with others;
    # h (80 GiB) is empty and the only card with room for llama3.1:70b, which no card
    # holds. A copy of the 32b on h would leave room for the 70b, but h loads one model
    # at a time: the 70b, asked for a moment later, would wait 27 s for that load.
    providers: list[dict[str, Any]] = [
        {"name": "l-a", "totalVramMiB": 49152, "maxParallel": 4,
         "tickets": [{"model": "qwen3:32b", "state": "loading", "startedAt": ago(0),
                      "footprintMiB": 27648}]},
        {"name": "h", "totalVramMiB": 81920, "maxParallel": 4},
    ]
    if other is not None:
        providers.append(other)
    return state(providers, models=[{"name": "qwen3:32b", "vramMiB": 27648},
                                    {"name": "llama3.1:70b", "vramMiB": big_mib}],
                 demand={"qwen3:32b": {"intents": 2}})


async def test_no_copy_as_soon_holds_up_the_only_card_another_model_fits() -> None:
    out = await place(_only_card_for_the_70b(), "qwen3:32b")
    assert (out["action"], out["provider"]) == ("loading", "l-a")


async def test_a_copy_as_soon_is_still_loaded_where_another_card_could_take_that_model(
) -> None:
    # A third card holds only an idle model: it could unload it for the 70b.
    spare = {"name": "s", "totalVramMiB": 81920, "maxParallel": 4,
             "residents": [{"model": "mixtral", "sizeMiB": 61440}]}
    out = await place(_only_card_for_the_70b(other=spare), "qwen3:32b")
    assert (out["action"], out["provider"]) == ("cold-load", "h")


async def test_a_copy_as_soon_that_leaves_no_room_for_that_model_is_loaded() -> None:
    # The other model would not fit beside the copy: an idle copy can be unloaded
    # again, a load under way cannot be taken back, so only the load line is guarded.
    out = await place(_only_card_for_the_70b(big_mib=61440), "qwen3:32b")
    assert (out["action"], out["provider"]) == ("cold-load", "h")
