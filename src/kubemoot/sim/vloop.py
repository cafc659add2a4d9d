"""A virtual-time asyncio event loop.

The simulator runs the production runtime unchanged; the runtime waits through
:class:`kubemoot.clock.LoopClock`, which reads the running loop's ``time()``. This loop's
``time()`` is virtual: when no callback is ready, instead of blocking in the selector
it jumps straight to the next scheduled callback. A simulated hour therefore costs only
the CPU time of the events in it, and the order of events is a pure function of the
program (no wall-clock jitter), which is what makes a seeded run reproducible.

Real I/O still works (the selector is polled without blocking), but a simulation
should not do any: a loop with nothing scheduled and nothing ready can never wake up,
so it raises :class:`SimulationStalled` instead of hanging.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import heapq
import selectors
from asyncio import format_helpers
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar, TypeVarTuple, Unpack

from kubemoot.clock import LoopClock

__all__ = ["SimulationStalled", "VirtualTimeLoop", "loop_clock", "run_virtual"]

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")

# asyncio's own constants of its loop turn (base_events), which :meth:`_run_once` follows
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5
_MAXIMUM_SELECT_TIMEOUT = 24 * 3600



class SimulationStalled(RuntimeError):
    """Every task waits on something that no scheduled event will ever deliver."""


class _VirtualSelector(selectors.BaseSelector):
    """Polls a real selector without blocking; an idle wait advances virtual time."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop
        #: How many file objects the loop registers for itself (its wake-up pipe).
        self.own = 0
        #: How many are registered now (the loop's turn asks on every turn).
        self.registered = 0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._real.register(fileobj, events, data)
        self.registered += 1
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._real.unregister(fileobj)
        self.registered -= 1
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0 and len(self._real.get_map()) <= self.own:
            # Callbacks are ready and nothing but the loop's own wake-up pipe is
            # registered: a poll (a system call every turn) could only drain that pipe,
            # which the next idle turn does; a callback sent from another thread is in
            # the ready queue already.
            return []
        events = self._real.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise SimulationStalled(
                "nothing is scheduled and nothing is ready: every task waits forever "
                f"(virtual time {self._loop.time():.3f} s)"
            )
        self._loop._advance_to_next_timer(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual and only moves when nothing is ready."""

    # asyncio's own state, which the timer jump reads (typeshed leaves it out).
    _scheduled: list[asyncio.TimerHandle]
    _timer_cancelled_count: int
    _selector: selectors.BaseSelector
    _debug: bool

    def __init__(self, *, start: float = 0.0) -> None:
        self._virtual_now = start
        self._running_virtual = False
        selector = _VirtualSelector(self)
        super().__init__(selector=selector)
        selector.own = len(selector.get_map())
        # Handles whose deadline is within this of now run together; virtual time has
        # no jitter, so a tiny resolution keeps distinct events distinct.
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual_now

    @property
    def running(self) -> bool:
        """Whether this loop is running now (in the one thread a simulation uses)."""
        return self._running_virtual

    def run_forever(self) -> None:
        self._running_virtual = True
        try:
            super().run_forever()
        finally:
            self._running_virtual = False

    def call_soon(self, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts,
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        """asyncio's ``call_soon`` in one frame: every future's and task's wake-up comes
        through here (about 55,000 a fleet-16 run), and asyncio's takes three frames
        and a debug check in the handle; the handle and where it goes are the same."""
        if self._debug or self._closed:  # type: ignore[attr-defined]
            return super().call_soon(callback, *args, context=context)
        # Handle.__init__'s assignments, here: one frame fewer per callback
        handle = _new_handle(_Handle)
        handle._context = contextvars.copy_context() if context is None else context
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def _run_once(self) -> None:
        """One turn of the loop: asyncio's own, step for step, without what a virtual
        loop with no files of its own does not need.

        A simulation takes tens of thousands of turns; in most of them callbacks are
        ready, so asyncio's turn polls the selector with a zero timeout (which answers
        nothing here), hands the empty answer on and reads the clock twice. This turn
        skips the poll when callbacks are ready and reads the virtual time directly;
        the clean-up of cancelled timers, the timers moved to the ready queue and the
        order callbacks run in are asyncio's (3.11's ``BaseEventLoop._run_once``), so
        a run takes the same turns in the same order. With a file of the program's own
        registered, or in debug mode, asyncio's turn runs instead.
        """
        selector = self._selector
        if self._debug or (
            not isinstance(selector, _VirtualSelector) or selector.registered > selector.own
        ):
            super()._run_once()  # type: ignore[misc]
            return
        scheduled = self._scheduled
        count = len(scheduled)
        if count > _MIN_SCHEDULED_TIMER_HANDLES and (
            self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION
        ):
            kept = []
            for timer in scheduled:
                if timer._cancelled:  # type: ignore[attr-defined]
                    timer._scheduled = False  # type: ignore[attr-defined]
                else:
                    kept.append(timer)
            heapq.heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:  # type: ignore[attr-defined]
                self._timer_cancelled_count -= 1
                timer = heapq.heappop(scheduled)
                timer._scheduled = False  # type: ignore[attr-defined]
        ready: collections.deque[asyncio.Handle] = self._ready  # type: ignore[attr-defined]
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            # idle: the selector polls once, then jumps the clock to the next timer
            timeout = None
            if scheduled:
                timeout = min(max(0.0, scheduled[0]._when - self._virtual_now),  # type: ignore[attr-defined]
                              _MAXIMUM_SELECT_TIMEOUT)
            self._process_events(self._selector.select(timeout))  # type: ignore[attr-defined]
        end_time = self._virtual_now + self._clock_resolution
        while scheduled:
            timer = scheduled[0]
            if timer._when >= end_time:  # type: ignore[attr-defined]
                break
            heapq.heappop(scheduled)
            timer._scheduled = False  # type: ignore[attr-defined]
            ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle._cancelled:  # type: ignore[attr-defined]
                continue
            # Handle._run, inline: one frame fewer for each of the run's callbacks
            try:
                handle._context.run(handle._callback, *handle._args)  # type: ignore[attr-defined]
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                source = format_helpers._format_callback_source(  # type: ignore[attr-defined]
                    handle._callback, handle._args)  # type: ignore[attr-defined]
                context = {"message": f"Exception in callback {source}",
                           "exception": exc, "handle": handle}
                if handle._source_traceback:  # type: ignore[attr-defined]
                    context["source_traceback"] = handle._source_traceback  # type: ignore[attr-defined]
                self.call_exception_handler(context)

    def _advance_to_next_timer(self, timeout: float) -> None:
        # Jump exactly onto the earliest live deadline (not now + timeout, which can
        # fall a rounding error short of it and spin).
        scheduled: list[asyncio.TimerHandle] = self._scheduled
        while scheduled and scheduled[0].cancelled():
            heapq.heappop(scheduled)
            self._timer_cancelled_count -= 1
        target = scheduled[0].when() if scheduled else self._virtual_now + timeout
        self._virtual_now = max(self._virtual_now, target)


class _Handle(asyncio.Handle):
    """A handle whose fields :meth:`VirtualTimeLoop.call_soon` sets itself, without
    asking the loop whether it is in debug mode again: it keeps no creation stack."""

    __slots__ = ()
    # asyncio's fields (typeshed leaves them out)
    _context: contextvars.Context
    _loop: asyncio.AbstractEventLoop
    _callback: Callable[..., object]
    _repr: str | None
    _source_traceback: object


_new_handle = object.__new__


class _VirtualClock(LoopClock):
    """A :class:`LoopClock` that reads its virtual-time loop's clock directly.

    The runtime and the engines ask the time tens of thousands of times per run; this
    skips asking asyncio for the running loop and the loop's ``time()`` method, with
    the same arithmetic (so the same floats). While its loop is not running it is a
    plain loop clock. A simulation runs in one thread; this clock is not for others.
    """

    def __init__(self, loop: VirtualTimeLoop, *, epoch: float | None,
                 anchor: float | None) -> None:
        super().__init__(epoch=epoch, anchor=anchor)
        self._loop = loop

    def now(self) -> float:
        loop = self._loop
        # Not asyncio.get_running_loop(): on this project's Python that alone costs
        # several times the rest of a reading.
        if not loop._running_virtual:  # the attribute, not the property: one call fewer
            return super().now()
        anchor = self._anchor
        if anchor is None:
            anchor = self._anchor = loop._virtual_now
        return self._epoch + (loop._virtual_now - anchor)


def loop_clock(*, epoch: float | None = None, anchor: float | None = None) -> LoopClock:
    """A clock on the running loop: one that reads a virtual-time loop directly when
    that is what runs, else a plain :class:`LoopClock`."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if isinstance(loop, VirtualTimeLoop):
        return _VirtualClock(loop, epoch=epoch, anchor=anchor)
    return LoopClock(epoch=epoch, anchor=anchor)


def run_virtual(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`; close it after."""
    loop = VirtualTimeLoop(start=start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_leftovers(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
