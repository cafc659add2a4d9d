"""Which capacity changes wake a queued call: each branch of ``options.could_help``.

A line of waiters is woken only by a change that could give it a better option than
the queue it holds (DESIGN §5). A filter that is too strict leaves a call sitting
until its wait limit although the fleet could serve it sooner; each branch below has
a case on both sides of its comparison, and the last test watches a real line wake
for an eviction that became possible.
"""

from __future__ import annotations

import asyncio

import pytest

from kubemoot.runtime.cost import load_seconds, unload_floor_seconds
from kubemoot.runtime.options import could_help
from kubemoot.runtime.placement import Action
from kubemoot.runtime.snapshot import FleetSnapshot, ProviderSnapshot
from kubemoot.runtime.waiting import CapacityWaiter
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import ProviderState
from kubemoot.testing.state import GIB, NOW, gpu, ticket
from kubemoot.testing.waiting import until_idle
from tests.runtime.builders import Harness, candidates

SETTINGS = RuntimeSettings()
M = 16 * GIB  # the preferred model's occupancy
LOAD = load_seconds(M, SETTINGS)  # 16 s
FLOOR = unload_floor_seconds(M, SETTINGS)  # 17 s: load after one unload

_CARDS: dict[str, ProviderState] = {
    "copy-of-m": gpu("copy-of-m", 24, residents={"m": 16}),
    "copy-of-n": gpu("copy-of-n", 24, residents={"n": 8}),  # n: the tolerated model
    "room": gpu("room", 24, residents={"x": 2}),  # 21 GiB free: m loads at once
    "after-unload": gpu("after-unload", 24, residents={"x": 20}),  # 3 GiB free, 23 usable
    "just-room": gpu("just-room", 24, residents={"x": 7}),  # exactly 16 GiB free
    "just-usable": gpu("just-usable", 17, residents={"x": 1}),  # usable exactly 16 GiB
    "too-small": gpu("too-small", 12),  # usable 11 GiB: never holds m
    "unknown-total": gpu("unknown-total", None),
}


def _helps(changed: str, best: float, *, occupancy: int | None = M) -> bool:
    fleet = FleetSnapshot.of(NOW, [ProviderSnapshot(state=s) for s in _CARDS.values()])
    return could_help(fleet, ["m", "n"], frozenset({changed}) if changed else frozenset(),
                      best=best, occupancy=occupancy, settings=SETTINGS)


@pytest.mark.parametrize(
    ("changed", "best", "occupancy", "wakes"),
    [
        ("", 1e9, M, False),  # nothing changed
        ("gone", 1e9, M, False),  # a provider no longer in the fleet
        ("too-small", 1e9, None, True),  # no size to judge room by: look again
        # a slot or copy of any accepted model, whatever the queue costs
        ("copy-of-m", 0.0, M, True),
        ("copy-of-n", 0.0, M, True),
        # room to load m: helps only a queue dearer than the load
        ("room", LOAD + 0.5, M, True),
        ("room", LOAD, M, False),
        ("room", LOAD - 0.5, M, False),
        ("just-room", LOAD + 0.5, M, True),  # room exactly the model's size is room
        # a card that could hold m after unloads: only a queue dearer than any plan
        ("after-unload", FLOOR + 0.5, M, True),
        ("after-unload", FLOOR, M, False),
        ("after-unload", FLOOR - 0.5, M, False),
        ("just-usable", FLOOR + 0.5, M, True),  # usable exactly the model's size holds it
        # a card that can never hold m, and one whose size nobody published
        ("too-small", 1e9, M, False),
        ("unknown-total", 1e9, M, False),
    ],
)
def test_each_branch_of_the_wake_filter(
    changed: str, best: float, occupancy: int | None, wakes: bool
) -> None:
    assert _helps(changed, best, occupancy=occupancy) is wakes


async def test_a_queued_call_wakes_when_an_eviction_would_serve_it_sooner(make) -> None:
    # "home" holds m with one slot, 5 s into a 40 s call: a 35 s queue. "other" is full
    # of x, which a call is using, so nothing can be unloaded there yet.
    h: Harness = await make(
        [gpu("home", 24, residents={"m": 16}), gpu("other", 24, residents={"x": 20})],
        tickets={"home": [ticket("m", age=5, ident="busy")],
                 "other": [ticket("x", age=1, ident="using-x")]},
        latency={"home": 40}, declared={"m": 16},
    )
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=await h.watch(), board=h.board)
    task = asyncio.create_task(waiter.place(candidates("m"), agent="a"))
    await until_idle()
    assert not task.done()  # it queues: 35 s, no plan can unload x

    # x's call ends: x is idle, and unloading it (16 s load + 1 s unload) beats 35 s
    await h.tickets.release("other", "using-x")
    await until_idle()

    assert task.done()
    placed = task.result()
    assert (placed.action, placed.provider, placed.evicted) == (Action.UNLOAD, "other", ("x",))
    await h.planner.release(placed)
