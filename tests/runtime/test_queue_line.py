"""Calls queued without a ticket count in the queue, and waiters are served in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubemoot.runtime.cost import CostModel, OptionKind
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.placement import Action, CallPlacement
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ProviderSnapshot
from kubemoot.runtime.waiting import CapacityWaiter
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import TicketState
from kubemoot.testing.state import NOW, gpu, ticket
from kubemoot.testing.waiting import until_idle
from tests.runtime.builders import Harness, candidates


@pytest.mark.parametrize(
    ("ages", "slots", "ahead", "expected"),
    [
        ([5], 1, 0, 15.0),  # the spec's 15 s: nobody queued before this call
        ([5], 1, 4, 15.0 + 4 * 20),  # four waiters ahead: the spec's 95 s
        ([5], 2, 0, 0.0),  # a free slot
        ([5], 2, 1, 15.0),  # …which the waiter ahead takes
        ([], 2, 1, 0.0),  # one waiter ahead, two free slots
        ([], 2, 3, 20.0 + 1 * 20 / 2),  # both slots promised: the earlier ones end first
    ],
)
def test_waiters_ahead_count_in_the_queue(
    ages: list[float], slots: int, ahead: int, expected: float
) -> None:
    p = ProviderSnapshot(
        state=gpu("p", 24, residents={"m": 12}, slots=slots),
        tickets=tuple(ticket("m", age=a, ident=f"t{i}") for i, a in enumerate(ages)),
        latency_seconds=20,
    )
    cost = CostModel(FleetSnapshot.of(NOW, [p]), settings=RuntimeSettings(),
                     occupancy=OccupancyBook(), demand=DemandSnapshot())
    assert cost.queue(p, "m", ahead=ahead) == pytest.approx(expected, abs=1e-9)
    assert p.has_free_slot("m", ahead=ahead) is (len(ages) + ahead < slots)


def _busy_home(h_tickets: int = 1) -> dict[str, Any]:
    # "home" holds m warm with one slot, busy 5 s into a 20 s call; "idle" could load
    # m (16 GiB: a 16 s cold load).
    return dict(
        providers=[gpu("home", 24, residents={"m": 16}), gpu("idle", 24)],
        tickets={"home": [ticket("m", age=5, ident=f"busy{i}") for i in range(h_tickets)]},
        latency={"home": 20},
        declared={"m": 16},
    )


async def test_a_fresh_call_counts_the_calls_waiting_before_it(make) -> None:
    setup = _busy_home()
    h = await make(setup.pop("providers"), **setup)
    alone = await h.planner.place(candidates("m"), holder_id="a", ahead=0)
    assert (alone.action, alone.provider) == (Action.QUEUE, "home")  # 15 s < 16 s
    behind = await h.planner.place(candidates("m"), holder_id="b", ahead=1)
    # 15 + 20 = 35 s in the queue against a 16 s load: a second copy.
    assert (behind.action, behind.provider) == (Action.COLD_LOAD, "idle")
    queue = next(o for o in behind.options if o.kind is OptionKind.QUEUE)
    # priced with its company: the one call ahead waits too (35 s · (1 + 1))
    assert queue.seconds == pytest.approx(70.0, abs=1e-6)


async def _join(waiter: CapacityWaiter, holder: str) -> asyncio.Task[CallPlacement]:
    task = asyncio.create_task(waiter.place(candidates("m"), agent=holder))
    await until_idle()  # it placed, found no room and waits in line
    assert not task.done()
    return task


async def _settle() -> None:
    """Until every waiter and the dispatcher wait again: what a change did is done."""
    await until_idle()


async def test_a_freed_slot_goes_to_the_oldest_waiter(make) -> None:
    # Only one card and no room for a second copy: every call waits for the one slot.
    h: Harness = await make([gpu("home", 24, residents={"m": 20})],
                            tickets={"home": [ticket("m", age=5, ident="busy")]},
                            latency={"home": 20}, declared={"m": 20})
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=await h.watch(), board=h.board)
    first, second, third = [await _join(waiter, name) for name in ("a", "b", "c")]
    assert waiter.waiting_for("m") == 3

    await h.tickets.release("home", "busy")
    await _settle()
    assert first.done() and not second.done() and not third.done()
    got = first.result()
    assert got.action is Action.WARM and got.ticket is not None

    await h.planner.release(got)
    await _settle()
    assert second.done() and not third.done()
    await h.planner.release(second.result())
    placed = await asyncio.wait_for(third, 5)
    assert placed.placed and waiter.waiting_for("m") == 0


async def test_when_room_appears_the_longest_backlog_loads_a_second_copy(make) -> None:
    # "idle" is full of another call's loading model; three calls queue for "home".
    h: Harness = await make(
        [gpu("home", 24, residents={"m": 16}), gpu("idle", 24)],
        tickets={
            "home": [ticket("m", age=5, ident="busy")],
            "idle": [ticket("other", age=1, ident="filler", footprint_gib=20,
                            state=TicketState.LOADING)],
        },
        latency={"home": 20}, declared={"m": 16},
    )
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=await h.watch(), board=h.board)
    tasks = [await _join(waiter, name) for name in ("a", "b", "c")]

    await h.tickets.release("idle", "filler")  # room for m on "idle"
    await _settle()
    # The head's 15 s queue beats a 16 s load; the last call (55 s behind two others)
    # loads a copy on the freed card.
    assert [t.done() for t in tasks] == [False, False, True]
    last = tasks[2].result()
    assert (last.action, last.provider) == (Action.COLD_LOAD, "idle")
    for task in tasks[:2]:
        task.cancel()


async def test_a_change_that_cannot_help_does_not_wake_the_line(make) -> None:
    h: Harness = await make(
        [gpu("home", 24, residents={"m": 20}), gpu("tiny", 8, residents={"x": 2})],
        tickets={"home": [ticket("m", age=5, ident="busy")]},
        latency={"home": 20}, declared={"m": 20},
    )
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=await h.watch(), board=h.board)
    task = await _join(waiter, "a")
    calls = 0
    place = h.planner.place

    async def counting(*args: Any, **kwargs: Any) -> CallPlacement:
        nonlocal calls
        calls += 1
        return await place(*args, **kwargs)

    h.planner.place = counting  # type: ignore[method-assign]
    await h.set_state(gpu("tiny", 8, residents={"x": 2, "y": 1}))  # cannot hold m at all
    await _settle()
    assert calls == 0 and not task.done()

    await h.tickets.release("home", "busy")  # the slot it waits for
    placement = await asyncio.wait_for(task, 5)
    assert calls == 1 and placement.action is Action.WARM
