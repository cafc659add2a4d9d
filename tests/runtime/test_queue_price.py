"""A queue's price counts the calls expected behind it (DESIGN §5, room to improve).

A second copy of a busy model shortens the waits of the calls that will queue behind
this one as well, so the one comparison prices a queue with them. A call with no other
demand is priced by its own wait alone: a model is never duplicated to dodge a slot.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubemoot.runtime.cost import CostModel, Option, OptionKind
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ModelDemand, ProviderSnapshot
from kubemoot.runtime.what_if import PlacementState
from kubemoot.settings import RuntimeSettings
from kubemoot.testing.state import NOW, gpu
from tests.runtime.test_tie_order_and_loading_copies import ago, options, place, state


def _cost(wanted: ModelDemand, *, weight: float = 1.0) -> CostModel:
    p = ProviderSnapshot(state=gpu("p", 24, residents={"m": 8}, slots=1))
    return CostModel(FleetSnapshot.of(NOW, [p]),
                     settings=RuntimeSettings(queue_demand_weight=weight),
                     occupancy=OccupancyBook(), demand=DemandSnapshot({"m": wanted}))


QUEUE = Option(OptionKind.QUEUE, "p", "m", 10.0)


@pytest.mark.parametrize(
    ("wanted", "weight", "seconds"),
    [
        (ModelDemand(), 1.0, 10.0),  # nobody else wants the model: its own wait only
        (ModelDemand(waiters=1), 1.0, 10.0),  # the one waiter is this call itself
        (ModelDemand(waiters=3), 1.0, 30.0),  # two others wait behind it
        (ModelDemand(intents=1, recent_use=2.0), 1.0, 30.0),  # 1 + 0.5·2 others expected
        (ModelDemand(waiters=3), 0.0, 10.0),  # weight 0: DESIGN §5's floor
        (ModelDemand(waiters=3), 0.5, 20.0),
    ],
)
def test_priced_queue(wanted: ModelDemand, weight: float, seconds: float) -> None:
    assert _cost(wanted, weight=weight).priced_queue(QUEUE).seconds == pytest.approx(seconds)


@pytest.mark.parametrize("kind", [OptionKind.WARM, OptionKind.COLD_LOAD, OptionKind.UNLOAD])
def test_only_queues_are_repriced(kind: OptionKind) -> None:
    option = Option(kind, "p", "m", 10.0)
    assert _cost(ModelDemand(waiters=5)).priced_queue(option) == option


def _busy_14b(demand: dict[str, Any], *, empty_slots: int = 4) -> Any:
    # qwen3:14b (12 GiB) on a one-slot card running one call; an empty 24 GiB card
    # beside it, where a second copy would load in 12 s, with room for the company
    # (four slots) unless told otherwise.
    return state([
        {"name": "busy", "totalVramMiB": 24576, "maxParallel": 1,
         "residents": [{"model": "qwen3:14b", "sizeMiB": 12288}],
         "tickets": [{"model": "qwen3:14b", "startedAt": ago(5), "footprintMiB": 0}]},
        {"name": "empty", "totalVramMiB": 24576, "maxParallel": empty_slots},
    ], models=[{"name": "qwen3:14b", "vramMiB": 12288}], demand=demand)


async def test_calls_behind_a_queue_pay_for_a_second_copy() -> None:
    # 6 s left on the busy copy (latency 6 s) against a 12 s load: alone it queues;
    # with three other calls waiting for the model, the queue costs 6 · 4 = 24 s and
    # the second copy wins.
    fast = {"latencySeconds": 6}

    def snapshot(demand: dict[str, Any], empty_slots: int = 4) -> Any:
        doc = _busy_14b(demand, empty_slots=empty_slots).model_dump(by_alias=True, mode="json")
        doc["providers"][0].update(fast)
        doc["providers"][0]["tickets"][0]["startedAt"] = ago(0)
        return type(_busy_14b({})).model_validate(doc)

    alone = await place(snapshot({}), "qwen3:14b")
    assert alone["action"] == "queue"
    crowded = await place(snapshot({"qwen3:14b": {"waiters": 4}}), "qwen3:14b")
    assert (crowded["action"], crowded["provider"]) == ("cold-load", "empty")
    # The second time, on a one-slot card: the four calls would line up on its one slot
    # (slot-aware price: 12 + (4 − 1) · 30 s / 1 = 102 s), so they queue at the busy copy.
    narrow = await place(snapshot({"qwen3:14b": {"waiters": 4}}, 1), "qwen3:14b")
    assert narrow["action"] == "queue"
    assert ("cold-load", "empty", "qwen3:14b", 102.011) in options(narrow)


def _loading_14b(demand: dict[str, Any]) -> Any:
    # l-a is loading qwen3:14b for another call (its one slot is that call's); c-b is
    # empty and could load a second copy.
    return state([
        {"name": "l-a", "totalVramMiB": 24576, "maxParallel": 1,
         "tickets": [{"model": "qwen3:14b", "state": "loading", "startedAt": ago(1),
                      "footprintMiB": 12288}]},
        {"name": "c-b", "totalVramMiB": 24576, "maxParallel": 1},
    ], models=[{"name": "qwen3:14b", "vramMiB": 12288}], demand=demand)


async def test_a_lone_call_converges_on_the_copy_being_loaded() -> None:
    out = await place(_loading_14b({}), "qwen3:14b")
    assert (out["action"], out["provider"]) == ("queue", "l-a")


async def test_company_behind_a_loading_copy_pays_for_a_second_one() -> None:
    out = await place(_loading_14b({"qwen3:14b": {"waiters": 4}}), "qwen3:14b")
    assert (out["action"], out["provider"]) == ("cold-load", "c-b")


def _loading_14b_with_8b_in_band(demand: dict[str, Any]) -> Any:
    # As above, but the call's band holds qwen3:8b too (6 GiB: 6 s to load on c-b,
    # against 11 s left of the 14b's load and a call ahead on its one slot).
    doc = _loading_14b(demand).model_dump(by_alias=True, mode="json")
    doc["models"].append({"name": "qwen3:8b", "vramMiB": 6144})
    return PlacementState.model_validate(doc)


async def test_a_lone_call_converges_even_when_a_band_model_would_load_sooner() -> None:
    out = await place(_loading_14b_with_8b_in_band({}), ("qwen3:14b", 60), ("qwen3:8b", 55))
    assert (out["action"], out["provider"], out["model"]) == ("queue", "l-a", "qwen3:14b")


async def test_company_behind_a_loading_copy_may_pay_for_a_band_model_elsewhere() -> None:
    # Waiters for the 14b make its coming copy's queue dear; the cheapest option of the
    # one comparison is then the 8b on the idle card, and step 3 no longer holds it back.
    out = await place(_loading_14b_with_8b_in_band({"qwen3:14b": {"waiters": 4}}),
                      ("qwen3:14b", 60), ("qwen3:8b", 55))
    assert (out["action"], out["provider"], out["model"]) == ("cold-load", "c-b", "qwen3:8b")


# -- the slot-aware cold-load price (DESIGN §5) ---------------------------------------


def _card(name: str, slots: int, latency: float = 20.0) -> ProviderSnapshot:
    return ProviderSnapshot(state=gpu(name, 48, slots=slots), latency_seconds=latency)


@pytest.mark.parametrize(
    ("wanted", "slots", "seconds"),
    [
        (ModelDemand(), 1, 0.0),  # alone: k = 1 fits any card's slots
        (ModelDemand(waiters=1), 1, 0.0),  # the one waiter is the asking call itself
        (ModelDemand(waiters=4), 2, 20.0),  # k = 4 on 2 slots: (4 − 2) · 20 / 2
        (ModelDemand(waiters=4), 4, 0.0),  # 4 slots take all four
        (ModelDemand(waiters=2, intents=3), 2, 30.0),  # k = 1 + 1 + 3 = 5: (5 − 2) · 20 / 2
        # recent use 300 over the 300 s window is one call a second: 12 more in a 12 s load
        (ModelDemand(recent_use=300.0), 4, 45.0),  # k = 13: (13 − 4) · 20 / 4
    ],
)
def test_crowding(wanted: ModelDemand, slots: int, seconds: float) -> None:
    p = _card("p", slots)
    cost = CostModel(FleetSnapshot.of(NOW, [p]), settings=RuntimeSettings(),
                     occupancy=OccupancyBook(), demand=DemandSnapshot({"m": wanted}))
    assert cost.crowding(p, "m", 12288) == pytest.approx(seconds)
    cold = cost.cold_option(p, "m", 12288)
    # load 12 s + best fit (47 − 12 = 35 GiB left) + the crowding
    assert cold.seconds == pytest.approx(12.0 + 0.035 + seconds)


async def test_fan_out_goes_to_the_card_with_slots_for_it() -> None:
    # Two empty cards: the tighter fit has one slot, the looser four. Alone, best fit
    # takes the tighter card; with five calls expected the one slot would queue four of
    # them, so the four-slot card wins though it leaves a bigger hole.
    def fleet(demand: dict[str, Any]) -> Any:
        return state([
            {"name": "narrow", "totalVramMiB": 16384, "maxParallel": 1, "latencySeconds": 20},
            {"name": "wide", "totalVramMiB": 49152, "maxParallel": 4, "latencySeconds": 20},
        ], models=[{"name": "qwen3:14b", "vramMiB": 12288}], demand=demand)

    alone = await place(fleet({}), "qwen3:14b")
    assert (alone["action"], alone["provider"]) == ("cold-load", "narrow")
    company = await place(fleet({"qwen3:14b": {"waiters": 5}}), "qwen3:14b")
    assert (company["action"], company["provider"]) == ("cold-load", "wide")


def test_calls_queued_ahead_in_this_process_are_company_the_board_has_not_seen() -> None:
    # A burst issued in one instant: the demand board (read a moment ago) shows nobody,
    # but two calls of this process already wait in line for the model.
    cost = _cost(ModelDemand())
    assert cost.priced_queue(QUEUE).seconds == pytest.approx(10.0)
    cost.queued_ahead = {"m": 2}
    assert cost.priced_queue(QUEUE).seconds == pytest.approx(30.0)
    cost.demand = DemandSnapshot({"m": ModelDemand(waiters=5)})  # the board knows more
    assert cost.priced_queue(QUEUE).seconds == pytest.approx(50.0)
