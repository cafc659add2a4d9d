"""On the wall clock a lease stopped before any renewal ends at once; one stopped while
a renewal is in flight still waits for that renewal (the simulator's loop keeps the
task's turns: tests/runtime/test_lease_turns.py)."""

from __future__ import annotations

import asyncio

from kubemoot.clock import SystemClock
from kubemoot.runtime.lease import Lease
from kubemoot.store.documents import Ticket


class _Renewer:
    def __init__(self) -> None:
        self.renewals = 0
        self.started = asyncio.Event()
        self.go = asyncio.Event()

    async def renew(self, provider: str, ticket_id: str, *,
                    ttl_seconds: float | None = None) -> Ticket:
        self.renewals += 1
        self.started.set()
        await self.go.wait()
        raise AssertionError("the test ends the lease before this returns")


async def _turns_taken(stop: asyncio.Future[None] | asyncio.Task[None]) -> int:
    """Loop iterations until ``stop`` is done."""
    turns = 0
    while not stop.done():
        await asyncio.sleep(0)
        turns += 1
    await stop
    return turns


async def test_a_lease_stopped_before_any_renewal_ends_without_waiting_a_turn() -> None:
    renewer = _Renewer()
    lease = Lease(renewer, "gpu", "t-1", clock=SystemClock(), ttl_seconds=30.0)
    lease.start()
    await asyncio.sleep(0)  # armed: waiting for its first renewal
    stop = asyncio.ensure_future(lease.stop())
    assert await _turns_taken(stop) <= 1  # the stop's own first step, no more
    assert renewer.renewals == 0


async def test_a_lease_stopped_as_it_is_made_ends_at_once_too() -> None:
    lease = Lease(_Renewer(), "gpu", "t-1", clock=SystemClock(), ttl_seconds=30.0)
    async with lease:
        pass  # not even armed yet
    assert lease.renewals == 0


async def test_a_stop_during_a_renewal_waits_for_that_renewal() -> None:
    renewer = _Renewer()
    lease = Lease(renewer, "gpu", "t-1", clock=SystemClock(), ttl_seconds=0.03)
    lease.start()
    await asyncio.wait_for(renewer.started.wait(), 5)
    stop = asyncio.ensure_future(lease.stop())
    for _ in range(10):
        await asyncio.sleep(0)
    assert not stop.done()  # the renewal in flight is waited for
    renewer.go.set()  # the renewal fails unexpectedly: the stop says why
    try:
        await asyncio.wait_for(stop, 5)
    except AssertionError as error:
        assert "before this returns" in str(error)
    else:
        raise AssertionError("the renewal's failure did not reach the stop")
