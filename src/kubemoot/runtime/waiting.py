"""Waiting for GPU capacity: state-driven, never a polling sleep.

A busy call records the capacity watch's change counter, places again against fresh
state, and blocks until the counter moves — every probe publish, claim and release
moves it. While it waits it holds ``wait.<model>.<agent>`` on the demand board, so other
agents' planners keep that model loaded. It says ``waiting`` (reason gpu-busy) once,
before its first block, and ``evaluating`` when a retry finally claims a GPU.

It gives up with reason gpu-busy when the discussion ends (the ``done`` event) or at
the wait limit, a safety net for a lost wake-up. Without a watch it gives up at once:
waiting without a wake source would only ever end at the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from kubemoot import metrics
from kubemoot.clock import Clock
from kubemoot.runtime.capacity import CapacityWatch, WatchUnavailable
from kubemoot.runtime.placement import Action, Candidate, Placement
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.refusals import Reason
from kubemoot.store.documents import TicketState
from kubemoot.store.protocol import StoreError


class WaitSignals(Protocol):
    """Where the waiter reports its progress (the agent runtime's signal publisher)."""

    async def waiting(self, *, model: str, reason: str) -> None: ...

    async def evaluating(self, *, model: str, provider: str) -> None: ...


class WaiterBoard(Protocol):
    """The part of the DemandBoard a waiter writes."""

    async def add_waiter(self, model: str, agent: str) -> None: ...

    async def remove_waiter(self, model: str, agent: str) -> None: ...


class CapacityWaiter:
    """Places a call, waiting on capacity changes while the GPUs are busy."""

    def __init__(
        self,
        planner: CallPlanner,
        *,
        clock: Clock,
        watch: CapacityWatch | None,
        board: WaiterBoard | None = None,
        limit_seconds: float | None = None,
    ) -> None:
        self._planner = planner
        self._clock = clock
        self._watch = watch
        self._board = board
        self._limit = (
            planner.settings.gpu_wait_limit_seconds if limit_seconds is None else limit_seconds
        )

    async def place(
        self,
        candidates: Sequence[Candidate],
        *,
        agent: str,
        holder_id: str | None = None,
        prompt_tokens: int | None = None,
        signals: WaitSignals | None = None,
        done: asyncio.Event | None = None,
        ticket_state: TicketState = TicketState.RUNNING,
    ) -> Placement:
        """A placement that holds a ticket, or the reason the agent stands aside."""
        holder = holder_id or agent
        model = candidates[0].model
        started = self._clock.now()
        waited = False
        outcome = "gave-up"
        try:
            while True:
                counter = self._watch.counter if self._watch is not None else 0
                placement = await self._planner.place(
                    candidates, holder_id=holder, prompt_tokens=prompt_tokens,
                    ticket_state=ticket_state,
                )
                elapsed = self._clock.now() - started
                if placement.placed:
                    if waited and signals is not None and placement.provider is not None:
                        await signals.evaluating(
                            model=placement.model or model, provider=placement.provider
                        )
                    outcome = "placed"
                    return replace(placement, waited_seconds=elapsed)
                if placement.action is Action.REFUSE:
                    outcome = "refused"
                    return replace(placement, waited_seconds=elapsed)
                if self._watch is None or (done is not None and done.is_set()):
                    return _gave_up(placement, elapsed)
                if not waited:
                    waited = True
                    metrics.WAITS.inc()
                    if self._board is not None:
                        with contextlib.suppress(StoreError):
                            await self._board.add_waiter(model, agent)
                    if signals is not None:
                        await signals.waiting(model=model, reason=Reason.GPU_BUSY.value)
                remaining = self._limit - elapsed
                if remaining <= 0 or not await self._block(counter, remaining, done):
                    return _gave_up(placement, self._clock.now() - started)
                # Whatever changed may be another process's claim or release.
                self._planner.invalidate()
        finally:
            if waited:
                metrics.WAIT_SECONDS.labels(outcome=outcome).observe(
                    self._clock.now() - started
                )
            if outcome == "gave-up":
                metrics.REFUSALS.labels(reason=Reason.GPU_BUSY.value).inc()
            if waited and self._board is not None:
                with contextlib.suppress(StoreError):
                    await self._board.remove_waiter(model, agent)

    async def _block(self, counter: int, timeout: float, done: asyncio.Event | None) -> bool:
        """Wait for a capacity change; False when the wait should end instead."""
        assert self._watch is not None
        change: asyncio.Task[int] = asyncio.ensure_future(
            self._watch.changed_since(counter, timeout)
        )
        waiters: set[asyncio.Future[Any]] = {change}
        if done is not None:
            waiters.add(asyncio.ensure_future(done.wait()))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in waiters:
                if not future.done():
                    future.cancel()
                    with contextlib.suppress(BaseException):
                        await future
        if done is not None and done.is_set():
            return False
        if change.cancelled():
            return False
        error = change.exception()
        if isinstance(error, TimeoutError | WatchUnavailable):
            return False
        if error is not None:
            raise error
        return True


def _gave_up(placement: Placement, elapsed: float) -> Placement:
    """Stand aside with gpu-busy (keeping the options for the explanation)."""
    return replace(
        placement, action=Action.WAIT, reason=Reason.GPU_BUSY.value, ticket=None,
        waited_seconds=elapsed,
    )
