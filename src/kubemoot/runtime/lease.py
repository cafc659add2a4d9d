"""Leases: a ticket stays alive for as long as the work behind it does.

A ticket's ``expiresAt`` only exists to reclaim the memory of a holder that died. A
live holder therefore renews its ticket a few times per TTL (every TTL/3, so two
renewals may fail before the ticket lapses), and stops when its call ends. Without
this a call longer than the TTL would lose its ticket mid-call, and its model would
look idle to other planners, who could unload it under the running call.

:class:`Lease` is the one way to do it, for every caller::

    async with planner.lease(placement):   # or tickets.lease(provider, ticket_id)
        ...  # the call runs; its ticket is renewed on the injected clock

The renewals follow the injected clock, so the simulator's virtual time drives them
like any timer. On a clock that waits with the running loop's own timers (the system
clock, the loop clock) a lease is one loop timer and starts a task only when a renewal
is due; on any other clock (a test's manual clock) it is a task that waits on the
clock's ``wait_for`` (a stop or the next turn, whichever comes first).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from kubemoot import metrics
from kubemoot.clock import Clock, LoopClock, SystemClock
from kubemoot.store.documents import Ticket
from kubemoot.store.protocol import KeyNotFound, StoreError

__all__ = ["Lease", "Renewer"]

log = logging.getLogger(__name__)

#: Renewals per TTL: one lost renewal (a store hiccup) still leaves the ticket alive.
RENEWALS_PER_TTL = 3


class Renewer(Protocol):
    """What a lease needs of the ticket manager."""

    async def renew(
        self, provider: str, ticket_id: str, *, ttl_seconds: float | None = None
    ) -> Ticket: ...


class Lease:
    """Renews one ticket every ``ttl_seconds / 3`` until stopped.

    ``lost`` turns true when a renewal found the ticket gone (released elsewhere, or
    lapsed while the store was unreachable); renewing then stops, with a log line.
    A renewal the store did not answer is logged, counted and tried at the next turn.
    """

    def __init__(
        self,
        renewer: Renewer,
        provider: str,
        ticket_id: str,
        *,
        clock: Clock,
        ttl_seconds: float,
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"lease of ticket {ticket_id}: ttl_seconds must be positive")
        self.provider = provider
        self.ticket_id = ticket_id
        self.interval_seconds = ttl_seconds / RENEWALS_PER_TTL
        self.renewals = 0
        self.lost = False
        self._renewer = renewer
        self._clock = clock
        self._ttl = ttl_seconds
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._turns: _Turns | None = None

    def start(self) -> None:
        """Begin renewing (idempotent)."""
        if self._task is not None or self._turns is not None:
            return
        if _loop_timed(self._clock):
            self._turns = _Turns(self)
            self._turns.start()
        else:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop renewing; a renewal in flight finishes first (it is harmless)."""
        self._stopped.set()
        turns = self._turns
        if turns is not None:
            await turns.stop()
            return
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            await asyncio.shield(task)

    async def __aenter__(self) -> Lease:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                await self._clock.wait_for(self._stopped.wait(), self.interval_seconds)
                return  # stopped
            except TimeoutError:
                pass  # the next turn: renew
            if await self._renew_once():
                continue
            return

    async def _renew_once(self) -> bool:
        """One renewal; False when the ticket is gone (renewing further is pointless)."""
        try:
            await self._renewer.renew(self.provider, self.ticket_id, ttl_seconds=self._ttl)
        except KeyNotFound:
            self.lost = True
            metrics.LEASE_RENEWALS.labels(result="lost").inc()
            log.warning("ticket %s on %s is gone while its holder still runs; its memory "
                        "is no longer promised", self.ticket_id, self.provider)
            return False
        except StoreError as error:
            metrics.LEASE_RENEWALS.labels(result="failed").inc()
            log.warning("renewal of ticket %s on %s failed (%s); trying again in %.0f s",
                        self.ticket_id, self.provider, error, self.interval_seconds)
            return True
        self.renewals += 1
        metrics.LEASE_RENEWALS.labels(result="renewed").inc()
        return True


def _loop_timed(clock: Clock) -> bool:
    """Whether ``clock`` waits with the running loop's own timers (then a renewal can be
    a loop timer); a clock that keeps its own time (a test's manual clock) cannot."""
    return isinstance(clock, LoopClock | SystemClock)


class _Turns:
    """A lease's renewals as loop timers: no task unless a renewal is due.

    Most calls end long before their first renewal (TTL/3), and a task per call that
    only waits was a good part of the simulator's cost per call. This runs the same
    schedule as :meth:`Lease._run` with one timer; a renewal gets a task of its own.

    It also keeps that loop's *turns*: each step happens in the same loop iteration
    (counted in ``call_soon`` hops) as in the task it replaces, and :meth:`stop` returns
    the same number of turns later. Other tasks therefore interleave with a lease
    exactly as before, which keeps the simulator's runs (decided by that interleaving)
    identical.
    """

    #: Turns from a stop (or a renewal's timer) to where the task's wait ended: its
    #: waiter task wakes, reports to ``wait_for``, which resumes the lease task.
    _STOP_TURNS = 3
    _RENEW_TURNS = 3

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._loop = asyncio.get_running_loop()
        #: True where the task this replaces would be done: the lease ended, or a
        #: renewal found the ticket gone.
        self.done = False
        self._stoppers: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._stopping = False
        #: Whether a stop keeps the replaced task's turns. Only a loop whose time is
        #: virtual needs them (the simulator's runs follow from the interleaving); on
        #: the wall clock a stop waiting for the next renewal ends at once, sparing each
        #: gateway call four loop turns and their callbacks before its release.
        self._keep_turns = not isinstance(lease._clock, SystemClock)

    def start(self) -> None:
        self._loop.call_soon(self._arm)  # where the task's first step ran

    def _arm(self) -> None:
        if self._stopping:
            self._finish()
            return
        self._timer = self._loop.call_later(self._lease.interval_seconds, self._due)

    def _due(self) -> None:
        self._timer = None
        if not self._stopping:  # a stop that came first ends the lease without it
            self._after(self._RENEW_TURNS, self._renew)

    def _renew(self) -> None:
        # Even when a stop came meanwhile: the task, once its wait had timed out, renewed
        # before it looked at the stop.
        self._renewal = self._loop.create_task(self._renew_turn())

    async def _renew_turn(self) -> None:
        renewed = False
        try:
            renewed = await self._lease._renew_once()
        finally:  # a renewal that failed unexpectedly ends the lease (stop raises it)
            if renewed and not self._stopping:
                self._timer = self._loop.call_later(self._lease.interval_seconds, self._due)
            else:
                self._finish()

    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done:
            self.done = True
            # A stopper goes on a turn later, as one awaiting the shielded task did.
            for stopper in self._stoppers:
                self._loop.call_soon(_resolve, stopper)
            self._stoppers.clear()

    def _after(self, turns: int, then: Callable[[], None]) -> None:
        self._turn((turns, then))

    def _turn(self, pending: tuple[int, Callable[[], None]]) -> None:
        # One argument, a tuple: the virtual loop calls a callback of one argument
        # without building the list and tuple of a ``*args`` call (about 4,700 turns
        # of leases a fleet-16 run).
        turns, then = pending
        if turns <= 0:
            then()
        else:
            self._loop.call_soon(self._turn, (turns - 1, then))

    async def stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            if not self._keep_turns and (self._renewal is None or self._renewal.done()):
                self._finish()  # no renewal in flight: nothing to wait for
            elif self._timer is not None:  # waiting for the next renewal: wake as it did
                self._after(self._STOP_TURNS, self._finish)
        renewal = self._renewal
        if renewal is not None and renewal is asyncio.current_task():
            return
        if not self.done:
            # Cancelling the stopper leaves the renewal in flight to finish (harmless).
            stopper: asyncio.Future[None] = self._loop.create_future()
            self._stoppers.append(stopper)
            await stopper
        if renewal is not None and renewal.done() and not renewal.cancelled():
            failure = renewal.exception()
            if failure is not None:  # as the lease task's own failure was, to the stopper
                raise failure


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
