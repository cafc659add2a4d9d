"""A lease on a loop-timed clock is a timer, not a task, and interleaves like the task.

The simulator's decisions follow from how its tasks interleave, so the timer-based
lease (:class:`kubemoot.runtime.lease._Turns`) must renew at the same instants and let
its stopper go on in the same loop turn as the task-based one, which a clock that keeps
its own time still uses. Each test runs both on a virtual-time loop and compares them,
counting the turns a stop takes with a callback that re-schedules itself once per loop
iteration (for a bounded number of turns: while it runs, virtual time stands still).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from kubemoot.clock import LoopClock
from kubemoot.runtime.lease import Lease
from kubemoot.runtime.tickets import TicketManager
from kubemoot.sim.vloop import run_virtual
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, PROVIDER_TICKETS_BUCKET, Ticket
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import NOW

T = TypeVar("T")
TTL = 30.0


class _OwnTimeClock:
    """LoopClock's time and waits behind a class the lease does not know as loop-timed:
    the lease then runs as a task (the path every other clock takes)."""

    def __init__(self, clock: LoopClock) -> None:
        self._clock = clock

    def now(self) -> float:
        return self._clock.now()

    async def sleep(self, seconds: float) -> None:
        await self._clock.sleep(seconds)

    async def wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        return await self._clock.wait_for(awaitable, timeout)


class _Turns:
    """Counts loop iterations from :meth:`start`: a callback that schedules itself
    again each turn, for at most ``LIMIT`` turns."""

    LIMIT = 50

    def __init__(self) -> None:
        self.count = 0
        self._loop = asyncio.get_running_loop()

    def start(self) -> None:
        self.count = 0
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.count += 1
        if self.count < self.LIMIT:
            self._loop.call_soon(self._tick)

    async def stop_counted(self, lease: Lease) -> int:
        """Stop the lease; how many turns passed before the stopper went on."""
        self.start()
        await lease.stop()
        return self.count


class _Noting:
    """The real ticket manager, noting when (virtual time) each renewal came."""

    def __init__(self, tickets: TicketManager) -> None:
        self._tickets = tickets
        self.seen: list[tuple[float, int]] = []

    async def renew(self, provider: str, ticket_id: str, *,
                    ttl_seconds: float | None = None) -> Ticket:
        self.seen.append((asyncio.get_running_loop().time(), len(self.seen)))
        return await self._tickets.renew(provider, ticket_id, ttl_seconds=ttl_seconds)


Scenario = Callable[[Lease, _Turns], Awaitable[list[object]]]


def _run(scenario: Scenario, *, own_time: bool) -> tuple[list[object], list[tuple[float, int]],
                                                         int]:
    async def main() -> tuple[list[object], list[tuple[float, int]], int]:
        loop_clock = LoopClock(epoch=NOW)
        kv = MemoryKV(clock=loop_clock)
        clock = _OwnTimeClock(loop_clock) if own_time else loop_clock
        tickets = TicketManager(await kv.bucket(PROVIDER_TICKETS_BUCKET),
                                await kv.bucket(PROVIDER_STATE_BUCKET), clock=clock,
                                ttl_seconds=TTL)
        ticket = await tickets.claim("gpu-a", "m", 0, "holder")
        tasks_before = len(asyncio.all_tasks())
        turns = _Turns()
        renewer = _Noting(tickets)
        lease = Lease(renewer, "gpu-a", ticket.ticket_id, clock=clock, ttl_seconds=TTL)
        lease.start()
        started_tasks = len(asyncio.all_tasks()) - tasks_before
        notes = await scenario(lease, turns)
        await kv.close()
        return notes, renewer.seen, started_tasks

    return run_virtual(main())


async def _stop_at_once(lease: Lease, turns: _Turns) -> list[object]:
    return [await turns.stop_counted(lease)]


async def _stop_after_a_while(lease: Lease, turns: _Turns) -> list[object]:
    await asyncio.sleep(TTL / 10)
    return [await turns.stop_counted(lease)]


async def _renew_then_stop(lease: Lease, turns: _Turns) -> list[object]:
    await asyncio.sleep(TTL * 1.5)  # four renewals (every TTL/3), then a wait
    return [await turns.stop_counted(lease), lease.renewals, lease.lost]


async def _stop_while_renewing(lease: Lease, turns: _Turns) -> list[object]:
    await asyncio.sleep(TTL / 3)  # the renewal's timer is due now
    for _ in range(5):  # in the turns where the renewal is under way
        await asyncio.sleep(0)
    return [await turns.stop_counted(lease), lease.renewals]


async def _stop_at_the_renewal_instant(lease: Lease, turns: _Turns) -> list[object]:
    await asyncio.sleep(TTL * 10 / 3)  # the tenth renewal is due as this sleep ends
    return [await turns.stop_counted(lease), lease.renewals]


async def _stop_just_after_the_renewal_instant(lease: Lease, turns: _Turns) -> list[object]:
    await asyncio.sleep(TTL / 3)
    await asyncio.sleep(0)  # the renewal's timer has fired; its renewal is under way
    return [await turns.stop_counted(lease), lease.renewals]


@pytest.mark.parametrize("scenario", [_stop_at_once, _stop_after_a_while, _renew_then_stop,
                                      _stop_while_renewing, _stop_at_the_renewal_instant,
                                      _stop_just_after_the_renewal_instant])
def test_the_timer_lease_renews_and_stops_in_the_turns_the_task_lease_did(
    scenario: Scenario,
) -> None:
    timer_notes, timer_renewals, timer_tasks = _run(scenario, own_time=False)
    task_notes, task_renewals, task_tasks = _run(scenario, own_time=True)
    assert (timer_notes, timer_renewals) == (task_notes, task_renewals)
    assert (timer_tasks, task_tasks) == (0, 1)  # the timer lease starts no task


def test_a_lease_renews_every_third_of_the_ttl_until_stopped() -> None:
    notes, renewals, _tasks = _run(_renew_then_stop, own_time=False)
    assert notes[1:] == [4, False]
    start = renewals[0][0] - TTL / 3
    assert [at - start for at, _turn in renewals] == pytest.approx([10.0, 20.0, 30.0, 40.0])


def test_a_lease_whose_ticket_is_gone_stops_renewing_and_says_so() -> None:
    async def gone(lease: Lease, turns: _Turns) -> list[object]:
        # released behind the lease's back: the next renewal finds nothing to renew
        kv_tickets = lease._renewer
        assert isinstance(kv_tickets, _Noting)
        await kv_tickets._tickets.release(lease.provider, lease.ticket_id)
        await asyncio.sleep(TTL)
        return [lease.lost, lease.renewals, await turns.stop_counted(lease)]

    timer = _run(gone, own_time=False)
    task = _run(gone, own_time=True)
    assert timer[:2] == task[:2]
    assert timer[0] == [True, 0, 0]  # a finished lease stops at once
    assert len(timer[1]) == 1  # one try, then no more


class _Broken:
    """A renewer with a bug: renewing raises what no lease expects."""

    async def renew(self, provider: str, ticket_id: str, *,
                    ttl_seconds: float | None = None) -> Ticket:
        raise RuntimeError("a bug in renewing")


@pytest.mark.parametrize("own_time", [False, True])
def test_a_renewal_that_fails_unexpectedly_ends_the_lease_and_its_stop_says_why(
    own_time: bool,
) -> None:
    async def main() -> None:
        loop_clock = LoopClock(epoch=NOW)
        clock = _OwnTimeClock(loop_clock) if own_time else loop_clock
        lease = Lease(_Broken(), "gpu-a", "t-1", clock=clock, ttl_seconds=TTL)
        lease.start()
        await asyncio.sleep(TTL)  # past the first renewal
        with pytest.raises(RuntimeError, match="a bug in renewing"):
            await lease.stop()

    run_virtual(main())
