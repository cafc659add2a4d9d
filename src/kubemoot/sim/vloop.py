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
import functools
import heapq
import operator
import selectors
from asyncio import format_helpers
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar, TypeVarTuple, Unpack

from kubemoot.clock import LoopClock

__all__ = ["SimulationStalled", "VirtualTimeLoop", "loop_clock", "run_virtual", "sleep"]

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
        #: How many are registered now.
        self.registered = 0
        #: Whether a file of the program's own is registered (``registered > own``):
        #: the loop's turn asks on every turn, and polls the selector only then.
        self.polling = False

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = self._real.register(fileobj, events, data)
        self.registered += 1
        self.polling = self.registered > self.own
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._real.unregister(fileobj)
        self.registered -= 1
        self.polling = self.registered > self.own
        return key

    def own_files(self) -> None:
        """Count what is registered now as the loop's own (its wake-up pipe)."""
        self.own = len(self.get_map())
        self.polling = self.registered > self.own

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


class _Deadline(float):
    """A timer's place in the loop's heap: its deadline, and the timer.

    asyncio's heap holds the timers themselves, which compare by deadline in a Python
    ``__lt__``; a push or a pop of a heap of n timers calls it about log2(n) times
    (about 53,000 calls a fleet-16 run). A float subclass compares in C and answers
    every comparison as the timers' ``__lt__`` would, so the heap takes the same shape
    and gives timers of equal deadlines in the same order.
    """

    __slots__ = ("handle",)
    handle: asyncio.TimerHandle


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual and only moves when nothing is ready."""

    # asyncio's own state (typeshed leaves it out). ``_scheduled`` is this loop's heap
    # of deadlines; asyncio's own turn, which reads timers there, never runs on it.
    _scheduled: list[_Deadline]  # type: ignore[assignment]
    _ready: collections.deque[asyncio.Handle]
    _timer_cancelled_count: int
    _selector: selectors.BaseSelector
    _debug: bool

    def __init__(self, *, start: float = 0.0) -> None:
        self._virtual_now = start
        self._running_virtual = False
        #: What the clocks on this loop read (see :meth:`_read_fast`): per (epoch,
        #: anchor), the time worked out at ``_read_at``, the virtual time of the last
        #: turn that looked; and the clocks reading them while the loop runs.
        self._readings: dict[tuple[float, float], _Reading] = {}
        self._read_at = start
        self._fast_clocks: list[_VirtualClock] = []
        selector = _VirtualSelector(self)
        super().__init__(selector=selector)
        selector.own_files()
        # Handles whose deadline is within this of now run together; virtual time has
        # no jitter, so a tiny resolution keeps distinct events distinct.
        self._clock_resolution = 1e-9
        # Every future and task asks its loop for one (about 25,000 futures a
        # fleet-16 run): asyncio's method is a Python frame around the constructor.
        self.create_future = functools.partial(asyncio.Future, loop=self)  # type: ignore[method-assign]
        # The loop's time and its tasks without a frame of this class around them
        # (about 5,000 and 8,000 a fleet-16 run), while nothing asks for asyncio's way:
        # a task factory, debug mode or a closed loop take the methods below.
        if type(self).time is VirtualTimeLoop.time:
            self.time = functools.partial(_VIRTUAL_NOW, self)  # type: ignore[method-assign]
        # Futures and tasks find call_soon on the loop from C for every wake-up (about
        # 54,000 a fleet-16 run), each time binding a new method object; bound once and
        # kept on the instance, the lookup finds it there.
        self.call_soon = self.call_soon  # type: ignore[method-assign]
        self._plain_tasks()

    def _plain_tasks(self) -> None:
        """Make tasks by the constructor itself when nothing asks for more, else by
        :meth:`create_task`."""
        plain = (type(self).create_task is VirtualTimeLoop.create_task and not self._debug
                 # (asyncio's __init__ asks set_debug before it has a task factory)
                 and getattr(self, "_task_factory", None) is None
                 and not self._closed)  # type: ignore[attr-defined]
        if plain:
            self.create_task = functools.partial(asyncio.Task, loop=self)  # type: ignore[method-assign]
        else:
            self.__dict__.pop("create_task", None)

    def set_debug(self, enabled: bool) -> None:
        super().set_debug(enabled)
        # Every future and task asks ``get_debug()`` as it is made (about 45,000 times
        # a fleet-16 run); the bound ``__bool__`` of the flag answers without a frame.
        self.get_debug = bool(enabled).__bool__  # type: ignore[method-assign]
        self._plain_tasks()

    def set_task_factory(self, factory: Any) -> None:
        super().set_task_factory(factory)
        self._plain_tasks()

    def close(self) -> None:
        super().close()
        self._plain_tasks()  # closed: create_task refuses as asyncio's does

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
            # stopped: the clocks read as a clock on no running loop does again
            for clock in self._fast_clocks:
                clock.__dict__.pop("now", None)
            self._fast_clocks.clear()

    def _read_fast(self, clock: _VirtualClock, epoch: float, anchor: float) -> None:
        """Let ``clock`` read the time this loop works out on each turn that moved it
        (``epoch + (now - anchor)``, the clock's own arithmetic, once per turn for every
        clock of that epoch and anchor) without a frame of its own, until the loop
        stops. The runtime and the engines ask the time about 60,000 times a fleet-16
        run, far more often than it moves. Only this loop's own turn keeps the
        readings; a subclass with another turn keeps the clock's method."""
        if type(self)._run_once is not VirtualTimeLoop._run_once or "now" in vars(clock):
            return  # (another turn, or the clock reads fast already)
        reading = self._readings.get((epoch, anchor))
        if reading is None:
            reading = self._readings[(epoch, anchor)] = _Reading(epoch, anchor)
        # (the others are current whenever a callback runs: each turn that moved the
        # clock works them out again before its callbacks, see _run_once)
        reading.value = epoch + (self._virtual_now - anchor)
        clock.now = functools.partial(_VALUE, reading)  # type: ignore[method-assign]
        self._fast_clocks.append(clock)

    def _retime(self) -> None:
        now = self._read_at = self._virtual_now
        for reading in self._readings.values():
            reading.value = reading.epoch + (now - reading.anchor)

    def create_task(self, coro: Any, *, name: object = None,  # type: ignore[override]
                    context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        """asyncio's ``create_task`` without its frames around the constructor (about
        8,000 tasks a fleet-16 run); a task factory or debug mode take asyncio's way."""
        if self._task_factory is not None or self._debug or self._closed:  # type: ignore[attr-defined]
            return super().create_task(coro, name=name, context=context)
        return asyncio.Task(coro, loop=self, name=name,  # type: ignore[arg-type]
                            context=context)

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
        self._ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[[Unpack[_Ts]], object],
                   *args: *_Ts, context: contextvars.Context | None = None
                   ) -> asyncio.TimerHandle:
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._virtual_now + delay, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[[Unpack[_Ts]], object], *args: *_Ts,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """asyncio's ``call_at``, the timer filled in one frame as in :meth:`call_soon`,
        and its deadline pushed on the heap (see :class:`_Deadline`)."""
        if when is None:
            raise TypeError("when cannot be None")
        if self._debug or self._closed:  # type: ignore[attr-defined]
            self._check_closed()  # type: ignore[attr-defined]
            self._check_thread()  # type: ignore[attr-defined]
            self._check_callback(callback, "call_at")  # type: ignore[attr-defined]
            timer = asyncio.TimerHandle(when, callback, args, self, context)
            if timer._source_traceback:  # type: ignore[attr-defined]
                del timer._source_traceback[-1]  # type: ignore[attr-defined]
        else:
            timer = _new_handle(_TimerHandle)
            timer._context = contextvars.copy_context() if context is None else context
            timer._loop = self
            timer._callback = callback
            timer._args = args
            timer._cancelled = False
            timer._repr = None
            timer._source_traceback = None
            timer._when = when
        deadline = _Deadline(when)
        deadline.handle = timer
        heapq.heappush(self._scheduled, deadline)
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def _run_once(self) -> None:
        """The loop's turns, until it is asked to stop: asyncio's own turn, step for
        step, without what a virtual loop with no files of its own does not need.

        asyncio's ``run_forever`` calls this once per turn and stops once a turn has
        set ``_stopping``; here the turns run in this one frame and it returns after
        the same turn, so ``run_forever`` stops at the same point. A simulation takes
        tens of thousands of turns; in most of them callbacks are ready, so asyncio's
        turn polls the selector with a zero timeout (which answers nothing here),
        hands the empty answer on and reads the clock twice. These turns poll only
        while a file of the program's own is registered; an idle turn without one
        jumps the clock to the first live deadline at once (a turn with nothing
        scheduled asks the selector, which raises :class:`SimulationStalled`). The
        clean-up of cancelled timers, the timers moved to the ready queue and the
        order callbacks run in are asyncio's (3.11's ``BaseEventLoop._run_once``), so
        a run takes the same turns in the same order. In debug mode each callback runs
        through its handle, which times it against the slow-callback limit as asyncio
        does (in virtual time).
        """
        selector = self._selector
        assert isinstance(selector, _VirtualSelector)
        resolution = self._clock_resolution
        heappop = heapq.heappop
        # The turn's callbacks are taken as a batch: the ready queue is swapped for an
        # empty one before they run, so what they schedule waits for the next turn, as
        # asyncio's count of the callbacks ready at the start of the turn has it, and
        # the batch is walked without a pop per callback.
        spare: collections.deque[asyncio.Handle] = collections.deque()
        while True:
            ready = self._ready
            scheduled = self._scheduled
            count = len(scheduled)
            if count > _MIN_SCHEDULED_TIMER_HANDLES and (
                self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION
            ):
                kept = []
                for deadline in scheduled:
                    if deadline.handle._cancelled:  # type: ignore[attr-defined]
                        deadline.handle._scheduled = False  # type: ignore[attr-defined]
                    else:
                        kept.append(deadline)
                heapq.heapify(kept)
                self._scheduled = scheduled = kept
                self._timer_cancelled_count = 0
            else:
                while scheduled and scheduled[0].handle._cancelled:  # type: ignore[attr-defined]
                    self._timer_cancelled_count -= 1
                    heappop(scheduled).handle._scheduled = False  # type: ignore[attr-defined]
            if not ready and not self._stopping:  # type: ignore[attr-defined]
                if scheduled and not selector.polling:
                    # idle, nothing to poll: jump onto the earliest live deadline (what
                    # the selector's idle wait does, not now + timeout, which can fall
                    # a rounding error short of it and spin)
                    first = float(scheduled[0])
                    if first > self._virtual_now:
                        self._virtual_now = first
                else:
                    # idle: the selector polls once, then jumps the clock to the next timer
                    timeout = None
                    if scheduled:
                        timeout = min(max(0.0, scheduled[0] - self._virtual_now),
                                      _MAXIMUM_SELECT_TIMEOUT)
                    self._process_events(selector.select(timeout))  # type: ignore[attr-defined]
                # Only an idle turn moves the clock: the clocks' readings move with it.
                if self._virtual_now != self._read_at:
                    self._retime()
            elif selector.polling:
                self._process_events(selector.select(0))  # type: ignore[attr-defined]
            end_time = self._virtual_now + resolution
            while scheduled:
                if scheduled[0] >= end_time:
                    break
                timer = heappop(scheduled).handle
                timer._scheduled = False  # type: ignore[attr-defined]
                ready.append(timer)
            if self._debug:
                self._run_ready_debug(ready)
            else:
                self._ready = spare
                for handle in ready:
                    if handle._cancelled:  # type: ignore[attr-defined]
                        continue
                    # Handle._run, inline: one frame fewer for each of the run's callbacks.
                    # A call with ``*args`` builds a list and a tuple each time (about
                    # 1,000 instructions under callgrind); most callbacks take one
                    # argument (a task's wake-up, its future) or none (a task's step).
                    args = handle._args  # type: ignore[attr-defined]
                    try:
                        if len(args) == 1:
                            handle._context.run(handle._callback, args[0])  # type: ignore[attr-defined]
                        elif args:
                            handle._context.run(handle._callback, *args)  # type: ignore[attr-defined]
                        else:
                            handle._context.run(handle._callback)  # type: ignore[attr-defined]
                    except (SystemExit, KeyboardInterrupt):
                        self._put_back(ready, handle)
                        raise
                    except BaseException as exc:
                        self._callback_failed(handle, exc)
                ready.clear()
                spare = ready
            if self._stopping:  # type: ignore[attr-defined]
                return

    def _put_back(self, batch: collections.deque[asyncio.Handle], handle: asyncio.Handle) -> None:
        """The callbacks of ``batch`` after ``handle``, whose callback raised out of the
        turn, go back to the front of the ready queue, where asyncio's turn leaves them."""
        rest = list(batch)
        rest = rest[next(i for i, h in enumerate(rest) if h is handle) + 1:]
        self._ready.extendleft(reversed(rest))
        batch.clear()

    def _run_ready_debug(self, ready: collections.deque[asyncio.Handle]) -> None:
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:  # type: ignore[attr-defined]
                try:
                    self._current_handle = handle  # what asyncio's debug turn names
                    handle._run()  # type: ignore[attr-defined]
                finally:
                    self._current_handle = None  # type: ignore[assignment]

    def _callback_failed(self, handle: asyncio.Handle, exc: BaseException) -> None:
        """What asyncio's ``Handle._run`` reports of a callback that raised."""
        source = format_helpers._format_callback_source(  # type: ignore[attr-defined]
            handle._callback, handle._args)  # type: ignore[attr-defined]
        context = {"message": f"Exception in callback {source}", "exception": exc,
                   "handle": handle}
        if handle._source_traceback:  # type: ignore[attr-defined]
            context["source_traceback"] = handle._source_traceback  # type: ignore[attr-defined]
        self.call_exception_handler(context)

    def _advance_to_next_timer(self, timeout: float) -> None:
        # Jump exactly onto the earliest live deadline (not now + timeout, which can
        # fall a rounding error short of it and spin).
        scheduled = self._scheduled
        while scheduled and scheduled[0].handle.cancelled():
            heapq.heappop(scheduled).handle._scheduled = False  # type: ignore[attr-defined]
            self._timer_cancelled_count -= 1
        target = float(scheduled[0]) if scheduled else self._virtual_now + timeout
        self._virtual_now = max(self._virtual_now, target)


class _Reading:
    """The time one epoch and anchor give, as the loop last worked it out."""

    __slots__ = ("anchor", "epoch", "value")

    def __init__(self, epoch: float, anchor: float) -> None:
        self.epoch, self.anchor = epoch, anchor
        self.value = epoch


_VALUE = operator.attrgetter("value")
_VIRTUAL_NOW = operator.attrgetter("_virtual_now")


class _Handle(asyncio.Handle):
    """A handle whose fields :meth:`VirtualTimeLoop.call_soon` sets itself, without
    asking the loop whether it is in debug mode again: it keeps no creation stack."""

    __slots__ = ()
    # asyncio's fields (typeshed leaves them out)
    _context: contextvars.Context
    _loop: asyncio.AbstractEventLoop
    _callback: Callable[..., object]
    _args: tuple[Any, ...]
    _cancelled: bool
    _repr: str | None
    _source_traceback: object


class _TimerHandle(asyncio.TimerHandle):
    """A timer whose fields :meth:`VirtualTimeLoop.call_at` sets itself."""

    __slots__ = ()
    _context: contextvars.Context
    _loop: asyncio.AbstractEventLoop
    _callback: Callable[..., object]
    _args: tuple[Any, ...]
    _cancelled: bool
    _repr: str | None
    _source_traceback: object
    _when: float


_new_handle = object.__new__


async def sleep(seconds: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """``asyncio.sleep(max(0, seconds))``, in fewer frames on a virtual-time loop: the
    same future, the same timer at the same deadline, woken in the same turn.

    The simulator sleeps a few thousand times a run (every computing call, every
    think time, the virtual clock's waits); asyncio's sleep asks for the running loop
    (a system call on this Python; ``loop``, the running one, spares it) and takes
    about ten frames of the loop's methods. Off a virtual-time loop, in debug mode or
    for no time at all, it is asyncio's.
    """
    if seconds > 0:
        if loop is None:
            loop = asyncio.get_running_loop()
        if isinstance(loop, VirtualTimeLoop) and not loop._debug:
            await _virtual_sleep(loop, seconds)
            return
    await asyncio.sleep(max(0.0, seconds))


def _wake_sleeper(future: asyncio.Future[None]) -> None:
    """asyncio's ``_set_result_unless_cancelled(future, None)``."""
    if not future.cancelled():
        future.set_result(None)


async def _virtual_sleep(loop: VirtualTimeLoop, seconds: float) -> None:
    future: asyncio.Future[None] = asyncio.Future(loop=loop)
    # A callback of one argument (asyncio's takes the future and None): the loop calls
    # it without a *args call's list and tuple (about 3,600 sleeps a fleet-16 run).
    timer = loop.call_at(loop._virtual_now + seconds, _wake_sleeper, future)
    try:
        await future
    except BaseException:
        timer.cancel()  # asyncio's sleep cancels its timer in every case; fired, it is
        raise  # out of the heap already and cancelling it changes nothing


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
        if not loop._debug:
            loop._read_fast(self, self._epoch, anchor)  # from now on while the loop runs
        return self._epoch + (loop._virtual_now - anchor)

    async def sleep(self, seconds: float) -> None:
        loop = self._loop
        if seconds > 0 and loop._running_virtual and not loop._debug:
            await _virtual_sleep(loop, seconds)  # no asking for the running loop
        else:
            await asyncio.sleep(max(0.0, seconds))


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
