"""ManualClock: time moves only when a test moves it, timeouts included."""

from __future__ import annotations

import asyncio

import pytest

from kubemoot.clock import ManualClock


async def test_wait_for_times_out_in_clock_time_not_real_time() -> None:
    clock = ManualClock(100.0)
    never = asyncio.Event()
    task = asyncio.create_task(clock.wait_for(never.wait(), 10.0))
    await clock.until_waiting()
    clock.advance(9.5)
    await asyncio.sleep(0)
    assert not task.done()  # 9.5 s of clock time is short of the timeout
    clock.advance(0.5)
    with pytest.raises(TimeoutError):
        await task
    assert clock.pending_deadlines == 0


async def test_wait_for_returns_what_finishes_first() -> None:
    clock = ManualClock()
    ready = asyncio.Event()

    async def answer() -> str:
        await ready.wait()
        return "done"

    task = asyncio.create_task(clock.wait_for(answer(), 60.0))
    await clock.until_waiting()
    ready.set()
    assert await task == "done"
    clock.advance(120.0)  # a spent deadline fires nothing
    assert clock.now() == 120.0 and clock.pending_deadlines == 0


async def test_another_tasks_sleep_moves_the_deadline_and_set_does_too() -> None:
    clock = ManualClock()
    first = asyncio.create_task(clock.wait_for(asyncio.Event().wait(), 5.0))
    second = asyncio.create_task(clock.wait_for(asyncio.Event().wait(), 50.0))
    await clock.until_waiting(2)
    await clock.sleep(5.0)
    with pytest.raises(TimeoutError):
        await first
    assert not second.done()
    clock.set(60.0)
    with pytest.raises(TimeoutError):
        await second


async def test_wait_for_without_timeout_and_with_zero_timeout() -> None:
    clock = ManualClock()

    async def value() -> int:
        return 7

    assert await clock.wait_for(value(), None) == 7
    with pytest.raises(TimeoutError):
        await clock.wait_for(asyncio.Event().wait(), 0.0)


async def test_cancelling_the_caller_cancels_what_it_waited_for() -> None:
    clock = ManualClock()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(clock.wait_for(work(), 30.0))
    await clock.until_waiting()
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(cancelled.wait(), 5)
