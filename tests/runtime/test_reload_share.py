"""A plan at selection charges a duplicated idle victim's reload by its share of slots.

The fleet: ``qwen3:14b`` busy on its one copy (a slot frees in 20 s), and an idle
``qwen2.5-coder:14b`` (11 GiB, wanted by 1 call: two recent uses) on two cards, one of
which could take the 14b once the coder is unloaded. A call prices that plan as the
spec does, 12 + 1 + 11 · 1 = 24 s, and queues. A plan made at selection sees that the
coder's other copy has a free slot for its one expected call, so unloading this copy
costs the coder half its slots: 12 + 1 + 11 · 1 · 1/2 = 18.5 s, and the plan unloads.
"""

from __future__ import annotations

import pytest

from kubemoot.runtime.cost import OptionKind
from kubemoot.runtime.placement import Action, CallPlacement
from kubemoot.store.documents import TicketState
from kubemoot.testing.state import gpu, ticket
from tests.runtime.builders import Harness, candidates

CODER = "qwen2.5-coder:14b"


async def _fleet(make, *, coder_busy_elsewhere: bool = False) -> Harness:
    tickets = {"rtx4090": [ticket("qwen3:14b", age=0)]}
    if coder_busy_elsewhere:
        tickets["rtx4070"] = [ticket(CODER, age=0, ident="coder-call")]
    h: Harness = await make(
        [
            gpu("rtx4090", 24, residents={"qwen3:14b": 12}),
            gpu("rtx4080", 16, residents={CODER: 11}),  # 15 usable: a 14b fits without the coder
            gpu("rtx4070", 12, residents={CODER: 11}),  # the coder's other copy; no room for a 14b
        ],
        tickets=tickets,
        latency={"rtx4090": 20},
    )
    await h.board.record_use(CODER)
    await h.board.record_use(CODER)  # recent use 2 → demand 1
    return h


async def _plan(h: Harness) -> CallPlacement:
    return await h.planner.place(candidates("qwen3:14b"), holder_id="agent@thread",
                                 ticket_state=TicketState.HELD)


def _seconds(placement: CallPlacement) -> dict[tuple[OptionKind, str], float]:
    return {(o.kind, o.provider): o.seconds for o in placement.options}


async def test_a_call_charges_the_victims_full_reload_and_queues(make) -> None:
    h = await _fleet(make)

    placement = await h.place("qwen3:14b")

    assert placement.action is Action.QUEUE
    seconds = _seconds(placement)
    assert seconds[(OptionKind.QUEUE, "rtx4090")] == pytest.approx(20.0, abs=1e-6)
    assert seconds[(OptionKind.UNLOAD, "rtx4080")] == pytest.approx(12 + 1 + 11 * 1.0, abs=1e-6)


async def test_a_plan_at_selection_charges_the_victims_share_and_unloads(make) -> None:
    h = await _fleet(make)

    placement = await _plan(h)

    assert placement.action is Action.UNLOAD
    assert (placement.provider, placement.evicted) == ("rtx4080", (CODER,))
    seconds = _seconds(placement)
    assert seconds[(OptionKind.UNLOAD, "rtx4080")] == pytest.approx(12 + 1 + 11 * 0.5, abs=1e-6)
    assert placement.ticket is not None and placement.ticket.state is TicketState.HELD


async def test_a_plan_charges_in_full_when_the_other_copy_has_no_free_slot(make) -> None:
    h = await _fleet(make, coder_busy_elsewhere=True)

    placement = await _plan(h)

    assert placement.action is Action.QUEUE
    assert _seconds(placement)[(OptionKind.UNLOAD, "rtx4080")] == pytest.approx(24.0, abs=1e-6)
