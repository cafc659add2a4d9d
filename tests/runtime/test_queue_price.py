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
from kubemoot.runtime.settings import RuntimeSettings
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ModelDemand, ProviderSnapshot
from kubemoot.testing.state import NOW, gpu
from tests.runtime.test_tie_order_and_loading_copies import ago, place, state


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


def _busy_14b(demand: dict[str, Any]) -> Any:
    # qwen3:14b (12 GiB) on a one-slot card running one call; an empty 24 GiB card
    # beside it, where a second copy would load in 12 s.
    return state([
        {"name": "busy", "totalVramMiB": 24576, "maxParallel": 1,
         "residents": [{"model": "qwen3:14b", "sizeMiB": 12288}],
         "tickets": [{"model": "qwen3:14b", "startedAt": ago(5), "footprintMiB": 0}]},
        {"name": "empty", "totalVramMiB": 24576, "maxParallel": 1},
    ], models=[{"name": "qwen3:14b", "vramMiB": 12288}], demand=demand)


async def test_calls_behind_a_queue_pay_for_a_second_copy() -> None:
    # 6 s left on the busy copy (latency 6 s) against a 12 s load: alone it queues;
    # with three other calls waiting for the model, the queue costs 6 · 4 = 24 s and
    # the second copy wins.
    fast = {"latencySeconds": 6}

    def snapshot(demand: dict[str, Any]) -> Any:
        doc = _busy_14b(demand).model_dump(by_alias=True, mode="json")
        doc["providers"][0].update(fast)
        doc["providers"][0]["tickets"][0]["startedAt"] = ago(0)
        return type(_busy_14b({})).model_validate(doc)

    alone = await place(snapshot({}), "qwen3:14b")
    assert alone["action"] == "queue"
    crowded = await place(snapshot({"qwen3:14b": {"waiters": 4}}), "qwen3:14b")
    assert (crowded["action"], crowded["provider"]) == ("cold-load", "empty")


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
