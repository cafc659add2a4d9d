from __future__ import annotations

import asyncio

import pytest

from kubemoot.clock import LoopClock
from kubemoot.sim.vloop import SimulationStalled, run_virtual


def test_an_hour_of_sleeps_costs_no_real_time_and_keeps_order() -> None:
    order: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        order.append((name, asyncio.get_running_loop().time()))

    async def main() -> None:
        await asyncio.gather(sleeper("hour", 3600), sleeper("second", 1), sleeper("day", 86400))

    run_virtual(main())
    # A real wait would take a day (pytest-timeout would end it); the virtual loop
    # reaches each wake-up at its exact virtual time, in order.
    assert order == [("second", 1.0), ("hour", 3600.0), ("day", 86400.0)]


def test_loop_clock_reads_virtual_time_from_an_epoch() -> None:
    async def main() -> tuple[float, float]:
        clock = LoopClock(epoch=1000.0)
        first = clock.now()
        await clock.sleep(42.5)
        return first, clock.now()

    assert run_virtual(main()) == (1000.0, 1042.5)


def test_timeouts_fire_in_virtual_time() -> None:
    async def main() -> float:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 30)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == 30.0


def test_a_program_that_can_never_wake_raises_instead_of_hanging() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationStalled):
        run_virtual(main())
