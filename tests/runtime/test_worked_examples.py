"""The spec's two worked examples, to the last digit (DESIGN §5)."""

from __future__ import annotations

import pytest

from kubemoot.runtime.cost import OptionKind
from kubemoot.runtime.placement import Action
from kubemoot.testing.state import gpu, ticket


async def test_queue_at_15s_beats_unloading_a_wanted_32b_at_26_5s(make) -> None:
    h = await make(
        [
            gpu("rtx5090", 32, residents={"qwen3:32b": 27}),
            gpu("rtx4090", 24, residents={"qwen3:14b": 12}),
        ],
        tickets={"rtx4090": [ticket("qwen3:14b", age=5)]},
        latency={"rtx4090": 20},
    )
    await h.board.record_use("qwen3:32b")  # recent use 1 → demand 0.5

    placement = await h.place("qwen3:14b")

    assert placement.action is Action.QUEUE
    assert (placement.provider, placement.model) == ("rtx4090", "qwen3:14b")
    assert placement.ticket is None  # a queue decision claims nothing
    by_kind = {o.kind: o for o in placement.options}
    assert by_kind[OptionKind.QUEUE].seconds == pytest.approx(15.0, abs=1e-6)
    unload = by_kind[OptionKind.UNLOAD]
    assert unload.seconds == pytest.approx(12 + 1 + 27 * 0.5, abs=1e-6)
    assert (unload.provider, unload.victims) == ("rtx5090", ("qwen3:32b",))
    assert await h.active("rtx5090") == []  # nothing was unloaded


async def test_five_queued_calls_lose_to_unloading_an_idle_unwanted_8b(make) -> None:
    busy = [ticket("qwen3:14b", age=5)] + [
        ticket("qwen3:14b", age=0, ident=f"queued-{i}") for i in range(4)
    ]
    h = await make(
        [
            gpu("rtx5090", 32, residents={"qwen3:32b": 27}),
            gpu("rtx4090", 24, residents={"qwen3:14b": 12}),
            gpu("rtx4080", 16, residents={"qwen3:8b": 8}),
        ],
        tickets={"rtx4090": busy},
        latency={"rtx4090": 20},
    )
    await h.board.record_use("qwen3:32b")

    placement = await h.place("qwen3:14b")

    assert placement.action is Action.UNLOAD
    assert (placement.provider, placement.evicted) == ("rtx4080", ("qwen3:8b",))
    seconds = {(o.kind, o.provider): o.seconds for o in placement.options}
    assert seconds[(OptionKind.QUEUE, "rtx4090")] == pytest.approx(15 + 4 * 20, abs=1e-6)
    assert seconds[(OptionKind.UNLOAD, "rtx4080")] == pytest.approx(12 + 1, abs=1e-6)
    assert seconds[(OptionKind.UNLOAD, "rtx5090")] == pytest.approx(26.5, abs=1e-6)
    # Claim first, then release: the ticket names its victim, and the victim's
    # residency entry is gone from the shared state.
    assert placement.ticket is not None
    assert placement.ticket.evicts == {"qwen3:8b": 8 * 1024}
    fleet = await h.view.snapshot()
    rtx4080 = fleet.provider("rtx4080")
    assert rtx4080 is not None and not rtx4080.is_resident("qwen3:8b")
