from __future__ import annotations

import asyncio
import contextvars
import heapq
import random
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from kubemoot.clock import LoopClock
from kubemoot.sim.vloop import (
    SimulationStalled,
    VirtualTimeLoop,
    loop_clock,
    run_virtual,
    sleep,
)


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


def test_real_io_is_still_seen_while_callbacks_keep_the_loop_busy() -> None:
    # The loop skips its per-turn poll only while nothing but its own wake-up pipe is
    # registered: a socket's reader still fires among busy turns, and a callback from
    # another thread runs without waiting for the loop to go idle.
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        turns = 0
        read_at: list[int] = []
        loop.add_reader(ours, lambda: read_at.append(turns) or ours.recv(16))
        from_thread = asyncio.Event()
        theirs.send(b"x")
        threading.Thread(target=loop.call_soon_threadsafe, args=(from_thread.set,)).start()
        while turns < 100_000 and not (read_at and from_thread.is_set()):
            turns += 1
            await asyncio.sleep(0)
        loop.remove_reader(ours)
        ours.close()
        theirs.close()
        return len(read_at), turns

    reads, turns = run_virtual(main())
    assert reads == 1
    assert turns < 100_000  # both came while the loop never went idle


@pytest.mark.parametrize("anchor", [None, 0.0, 5.0])
def test_the_virtual_loop_clock_reads_what_a_loop_clock_reads(anchor: float | None) -> None:
    """The simulator's clock reads the virtual loop directly: the same floats as a plain
    loop clock at every instant, before and after each wait, and a plain clock's answer
    off that loop."""
    epoch = 1_767_225_600.0
    clocks: list[LoopClock] = []

    async def main() -> list[tuple[float, float]]:
        await asyncio.sleep(0.1)  # an unanchored clock anchors at its first reading
        fast, plain = loop_clock(epoch=epoch, anchor=anchor), LoopClock(epoch=epoch,
                                                                          anchor=anchor)
        assert type(fast) is not LoopClock  # the virtual loop's own kind
        clocks.append(fast)
        readings = []
        for wait in (0.0, 0.3, 1e-9, 7.25, 3600.0):
            await asyncio.sleep(wait)
            readings.append((fast.now(), plain.now()))
        return readings

    for fast_reading, plain_reading in run_virtual(main(), start=12.5):
        assert fast_reading == plain_reading
    fast = clocks[0]
    assert fast.now() == epoch  # no loop running: time stands at the anchor

    async def on_another_loop() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        return loop.time(), fast.now(), loop.time()

    before, reading, after = asyncio.run(on_another_loop())
    start = 12.5 + 0.1 if anchor is None else anchor
    assert epoch + (before - start) <= reading <= epoch + (after - start)
    assert type(loop_clock(epoch=epoch)) is LoopClock  # off a virtual loop: a plain one



def test_clocks_read_the_loops_time_without_a_frame_of_their_own() -> None:
    """After its first reading a clock of the virtual loop reads what the loop worked
    out for its epoch and anchor on the turn (no frame per reading): the same floats
    as a plain loop clock, for clocks sharing an epoch and anchor or not, anchored late
    or not, read from tasks, callbacks and timers; a plain clock again once stopped."""
    epoch = 1_767_225_600.0
    seen: list[tuple[float, float]] = []
    clocks: list[LoopClock] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pairs = [(loop_clock(epoch=0.0, anchor=0.0), LoopClock(epoch=0.0, anchor=0.0)),
                 (loop_clock(epoch=0.0, anchor=0.0), LoopClock(epoch=0.0, anchor=0.0)),
                 (loop_clock(epoch=epoch, anchor=3.0), LoopClock(epoch=epoch, anchor=3.0))]

        def read() -> None:
            for fast, plain in pairs:
                seen.append((fast.now(), plain.now()))

        read()
        assert all("now" in vars(fast) for fast, _ in pairs)  # its own reader: no method
        first = pairs[0][0]
        assert type(first).now(first) == first.now()  # the method still answers the same
        for step, wait in enumerate((0.0, 0.25, 1e-9, 7.5, 0.0, 3600.0, 1 / 3)):
            await asyncio.sleep(wait)
            read()
            loop.call_soon(read)
            loop.call_later(wait / 2, read)
            if step == 2:  # a clock anchored at its first reading, late
                late = loop_clock(epoch=epoch)
                pairs.append((late, LoopClock(epoch=epoch, anchor=loop.time())))
        await asyncio.sleep(4000.0)
        read()
        clocks.extend(fast for fast, _ in pairs)

    run_virtual(main(), start=2.0)
    assert len(seen) > 60
    for fast_reading, plain_reading in seen:
        assert fast_reading == plain_reading
    for fast in clocks:  # stopped: as a plain clock with no loop running
        assert fast.now() == fast._epoch



def test_tasks_and_the_time_come_without_a_frame_until_asyncios_way_is_asked_for() -> None:
    """Plainly, the loop's time and its tasks are made by C-level callables (no frame of
    the loop around them); a task factory or debug mode take asyncio's way, and a
    closed loop refuses a task before wrapping its coroutine, as asyncio's does."""
    loop = VirtualTimeLoop(start=4.0)
    try:
        assert "time" in vars(loop) and "create_task" in vars(loop)
        assert loop.time() == 4.0

        async def answer() -> int:
            return 42

        task = loop.create_task(answer(), name="plain")
        assert type(task) is asyncio.Task and task.get_name() == "plain"
        assert loop.run_until_complete(task) == 42
        made: list[str] = []

        def factory(loop_: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
            made.append("factory")
            return asyncio.Task(coro, loop=loop_, **kw)

        loop.set_task_factory(factory)
        assert "create_task" not in vars(loop)
        assert loop.run_until_complete(loop.create_task(answer())) == 42 and made
        loop.set_task_factory(None)
        assert "create_task" in vars(loop)
        loop.set_debug(True)
        assert "create_task" not in vars(loop)
        loop.set_debug(False)
        assert "create_task" in vars(loop)
    finally:
        loop.close()
    assert "create_task" not in vars(loop)
    coro = answer()
    with pytest.raises(RuntimeError, match="closed"):
        loop.create_task(coro)
    coro.close()


class _AsyncioTurns(VirtualTimeLoop):
    """The virtual loop taking asyncio's own turn, ``call_soon``, timers (a heap of
    ``TimerHandle``) and task and future making instead of its own."""

    def _run_once(self) -> None:
        asyncio.SelectorEventLoop._run_once(self)  # type: ignore[attr-defined]

    def call_soon(self, *args: Any, **options: Any) -> asyncio.Handle:
        return asyncio.SelectorEventLoop.call_soon(self, *args, **options)

    def call_at(self, *args: Any, **options: Any) -> asyncio.TimerHandle:
        return asyncio.SelectorEventLoop.call_at(self, *args, **options)

    def call_later(self, *args: Any, **options: Any) -> asyncio.TimerHandle:
        return asyncio.SelectorEventLoop.call_later(self, *args, **options)

    def create_task(self, *args: Any, **options: Any) -> asyncio.Task[Any]:
        return asyncio.SelectorEventLoop.create_task(self, *args, **options)

    def _advance_to_next_timer(self, timeout: float) -> None:
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[assignment]
        while scheduled and scheduled[0].cancelled():
            heapq.heappop(scheduled)
            self._timer_cancelled_count -= 1
        target = scheduled[0].when() if scheduled else self._virtual_now + timeout
        self._virtual_now = max(self._virtual_now, target)


def _busy_program(seed: int, *, asyncio_sleeps: bool = False
                  ) -> Callable[[], Coroutine[Any, Any, list[tuple[float, str]]]]:
    """A program of timers, sleeps, events and ``call_soon`` chains that records what
    ran when; with ``asyncio_sleeps`` every sleep is asyncio's (else some are the
    virtual loop's :func:`~kubemoot.sim.vloop.sleep` and its clock's)."""
    async def program() -> list[tuple[float, str]]:
        rng = random.Random(seed)
        loop = asyncio.get_running_loop()
        clock = LoopClock() if asyncio_sleeps else loop_clock()
        sleeps: list[Callable[[float], Coroutine[Any, Any, None]]] = [asyncio.sleep]
        sleeps += [asyncio.sleep, asyncio.sleep] if asyncio_sleeps else [sleep, clock.sleep]
        seen: list[tuple[float, str]] = []
        # enough timers, most of them cancelled, for asyncio's bulk clean-up to run
        timers = [loop.call_later(rng.uniform(0, 50), seen.append, (0.0, f"timer {i}"))
                  for i in range(300)]
        for timer in rng.sample(timers, 220):
            timer.cancel()

        async def worker(name: str) -> None:
            for step in range(30):
                choice = rng.random()
                if choice < 0.4:
                    await rng.choice(sleeps)(rng.choice((0, 0, 0.5, 1e-10, -1,
                                                         rng.uniform(0, 9))))
                elif choice < 0.7:
                    loop.call_soon(seen.append, (loop.time(), f"{name} soon {step}"))
                    await asyncio.sleep(0)
                else:
                    event = asyncio.Event()
                    loop.call_later(rng.uniform(0, 3), event.set)
                    await event.wait()
                seen.append((loop.time(), f"{name} {step}"))

        await asyncio.gather(*(worker(f"w{i}") for i in range(8)))
        await asyncio.sleep(60)
        return seen

    return program


@pytest.mark.parametrize("seed", range(4))
def test_the_virtual_loop_turns_as_asyncio_does(seed: int) -> None:
    ours = run_virtual(_busy_program(seed)())
    loop = _AsyncioTurns()
    try:
        theirs = loop.run_until_complete(_busy_program(seed, asyncio_sleeps=True)())
    finally:
        loop.close()
    assert ours == theirs
    assert len(ours) > 240


def _tied_timers(seed: int, *, asyncio_sleeps: bool = False
                 ) -> Callable[[], Coroutine[Any, Any, list[str]]]:
    """Timers and sleeps that end at a few shared instants, pushed and popped in a
    drawn order: which of equal deadlines runs first is down to the heap's shape."""
    async def program() -> list[str]:
        rng = random.Random(seed)
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        pause = asyncio.sleep if asyncio_sleeps else sleep

        async def worker(name: str) -> None:
            for step in range(40):
                at = rng.choice((1.0, 2.0, 3.0)) * (1 + step // 10)
                if rng.random() < 0.5:
                    timer = loop.call_at(at, seen.append, f"{name} timer {step}")
                    if rng.random() < 0.2:
                        timer.cancel()
                else:
                    await pause(max(0.0, at - loop.time()))
                    seen.append(f"{name} woke {step}")

        await asyncio.gather(*(worker(f"w{i}") for i in range(12)))
        await asyncio.sleep(100)
        return seen

    return program


@pytest.mark.parametrize("seed", range(4))
def test_timers_of_equal_deadlines_run_in_asyncios_order(seed: int) -> None:
    ours = run_virtual(_tied_timers(seed)())
    loop = _AsyncioTurns()
    try:
        theirs = loop.run_until_complete(_tied_timers(seed, asyncio_sleeps=True)())
    finally:
        loop.close()
    assert ours == theirs
    assert len(ours) > 400  # all but the cancelled timers
    assert ours != sorted(ours)


def test_in_debug_mode_the_loop_takes_the_same_turns() -> None:
    # Debug mode takes asyncio's handles, timers and tasks (with their creation
    # stacks) and runs each callback through its handle; the order stays.
    loop = VirtualTimeLoop()
    loop.set_debug(True)
    assert loop.get_debug() is True
    try:
        debugged = loop.run_until_complete(_busy_program(1)())
    finally:
        loop.close()
    assert debugged == run_virtual(_busy_program(1)())


def test_a_callback_runs_in_the_context_it_was_given() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="outer")

    async def program() -> list[str]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        given = contextvars.copy_context()
        given.run(var.set, "given")
        loop.call_soon(lambda: seen.append(var.get()), context=given)
        var.set("copied")
        loop.call_soon(lambda: seen.append(var.get()))
        await asyncio.sleep(0)
        return seen

    assert run_virtual(program()) == ["given", "copied"]


def test_call_soon_is_bound_once() -> None:
    # futures and tasks look it up for each wake-up: no new method object each time
    loop = VirtualTimeLoop()
    try:
        assert loop.call_soon is loop.call_soon
        loop.set_debug(True)  # debug mode takes asyncio's way inside the same method
        assert run_virtual_on(loop) == ["ran"]
    finally:
        loop.close()


def run_virtual_on(loop: VirtualTimeLoop) -> list[str]:
    seen: list[str] = []
    loop.call_soon(seen.append, "ran")
    loop.call_soon(loop.stop)
    loop.run_forever()
    return seen


def test_callbacks_get_their_arguments_whatever_their_number() -> None:
    # the turn calls a callback of one argument, of none and of several each its own way
    async def program() -> list[tuple[object, ...]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[object, ...]] = []
        given = contextvars.copy_context()
        loop.call_soon(lambda *a: seen.append(a))
        loop.call_soon(lambda *a: seen.append(a), 1)
        loop.call_soon(lambda *a: seen.append(a), 1, 2, 3, context=given)
        loop.call_later(0.5, lambda *a: seen.append(a), (4,))
        loop.call_at(loop.time() + 1, lambda *a: seen.append(a), 5, 6)
        await asyncio.sleep(2)
        return seen

    assert run_virtual(program()) == [(), (1,), (1, 2, 3), ((4,),), (5, 6)]


def test_a_failing_callback_reaches_the_exception_handler_as_under_asyncio() -> None:
    def boom() -> None:
        raise ValueError("boom")

    def reported(loop_class: type[VirtualTimeLoop]) -> tuple[str, object]:
        loop = loop_class()
        seen: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: seen.append(context))

        async def program() -> None:
            asyncio.get_running_loop().call_soon(boom)
            await asyncio.sleep(1)

        try:
            loop.run_until_complete(program())
        finally:
            loop.close()
        [context] = seen
        return context["message"], type(context["exception"])

    assert reported(VirtualTimeLoop) == reported(_AsyncioTurns)
    assert reported(VirtualTimeLoop)[1] is ValueError


class _Stop(KeyboardInterrupt):
    """Raised out of a callback: it ends the loop's run, as asyncio lets it."""


@pytest.mark.parametrize("loop_class", [VirtualTimeLoop, _AsyncioTurns])
def test_a_callback_that_ends_the_run_leaves_the_rest_of_its_turn_queued(
    loop_class: type[VirtualTimeLoop],
) -> None:
    # The turn's callbacks after the one that raised run on the next run, before those
    # they scheduled, in asyncio's order (the virtual loop takes each turn's callbacks
    # as a batch: those left must go back to the front of the queue).
    loop = loop_class()
    seen: list[str] = []

    def stop() -> None:
        raise _Stop

    def mark(name: str) -> None:
        seen.append(name)
        loop.call_soon(seen.append, f"after {name}")

    for name in ("a", "b"):
        loop.call_soon(mark, name)
    loop.call_soon(stop)
    for name in ("c", "d"):
        loop.call_soon(mark, name)
    try:
        with pytest.raises(_Stop):
            loop.run_forever()
        assert seen == ["a", "b"]
        loop.call_soon(loop.stop)
        loop.run_forever()
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert seen == ["a", "b", "c", "d", "after a", "after b", "after c", "after d"]
