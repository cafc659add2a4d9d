"""Waiting, in tests, for something the test cannot be told about directly.

Inside one event loop a test waits on an event: an :class:`asyncio.Event`, a listener,
a :class:`kubemoot.clock.ManualClock` deadline, or a store watch (:func:`until_stored`,
which also covers writes made by other processes to a shared store). Some things send
no event this process can await: another process starting to serve, a browser
rendering a page, an operator running in a thread of its own. For those,
:func:`wait_until` looks again at a short interval until the condition holds, bounded
by a timeout, and a failure names what never happened instead of hanging or racing::

    await wait_until(lambda: server.listening, timeout=20, what="the gateway serving")

When a test must check that something did *not* happen (a waiter stayed in line), it
first waits until nothing in its loop can run any more: :func:`until_idle`, asyncio's
counterpart of trio's ``wait_all_tasks_blocked``.

The timeout is an upper bound for a stuck test, never a measured threshold: a fast
machine returns as soon as the condition holds.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from kubemoot.store.protocol import Bucket

__all__ = ["NeverHappened", "until_idle", "until_stored", "wait_until"]

T = TypeVar("T")

#: How long to wait before looking again; short, since the condition is usually cheap.
INTERVAL_SECONDS = 0.02


class NeverHappened(AssertionError):
    """A condition a test waited for did not hold within its timeout."""


#: A plain or an async function of no arguments.
Condition = Callable[[], Any]


async def _holds(condition: Condition) -> Any:
    value = condition()
    if inspect.isawaitable(value):
        return await value
    return value


@overload
async def wait_until(
    condition: Callable[[], Awaitable[T]], *, timeout: float, what: str,
    ignoring: tuple[type[Exception], ...] = (), interval: float = ...,
) -> T: ...


@overload
async def wait_until(
    condition: Callable[[], T], *, timeout: float, what: str,
    ignoring: tuple[type[Exception], ...] = (), interval: float = ...,
) -> T: ...


async def wait_until(
    condition: Condition,
    *,
    timeout: float,
    what: str,
    ignoring: tuple[type[Exception], ...] = (),
    interval: float = INTERVAL_SECONDS,
) -> Any:
    """Return ``condition()``'s first truthy value; fail after ``timeout`` real seconds.

    ``condition`` may be a plain or an async function. An exception of a type in
    ``ignoring`` counts as "not yet" (e.g. a ``KeyError`` while an object does not
    exist yet); the last one is named in the failure.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = await _holds(condition)
        except ignoring as error:
            last_error, value = error, None
        if value:
            return value
        if loop.time() >= end:
            because = f" (last error: {last_error!r})" if last_error is not None else ""
            raise NeverHappened(f"{what}: did not happen within {timeout:g} s{because}")
        await asyncio.sleep(interval)


@overload
async def until_stored(
    bucket: Bucket, condition: Callable[[], Awaitable[T]], *, timeout: float, what: str,
) -> T: ...


@overload
async def until_stored(
    bucket: Bucket, condition: Callable[[], T], *, timeout: float, what: str,
) -> T: ...


async def until_stored(
    bucket: Bucket,
    condition: Condition,
    *,
    timeout: float,
    what: str,
) -> Any:
    """Return ``condition()``'s first truthy value, looking again at each change of ``bucket``.

    The watch starts before the first look, so a write between the look and the wait
    is still seen; whoever writes (this process or another one sharing the store),
    nothing is polled.
    """
    watch = bucket.watch()
    try:
        async with asyncio.timeout(timeout):
            await watch.ready()
            value = await _holds(condition)
            if value:
                return value
            async for _change in watch:
                value = await _holds(condition)
                if value:
                    return value
    except TimeoutError:
        raise NeverHappened(f"{what}: did not happen within {timeout:g} s of changes to "
                            f"{bucket.name}") from None
    finally:
        await watch.aclose()
    raise NeverHappened(f"{what}: the watch on {bucket.name} ended before it happened")


#: Loop turns :func:`until_idle` allows before it calls the loop busy for ever.
IDLE_TURNS = 100_000


async def until_idle(*, turns: int = IDLE_TURNS) -> None:
    """Return once every other task of this loop waits on something (an event, a
    clock, I/O), so no callback is ready to run.

    Unlike yielding a fixed number of times, this does not guess how many turns the
    code under test needs. A loop that stays busy for ``turns`` turns (a task that
    spins) fails with :class:`NeverHappened`. Reads the ready queue of asyncio's own
    loop (``BaseEventLoop._ready``); another loop implementation is refused clearly.
    """
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)
    if ready is None:
        raise RuntimeError(f"until_idle needs asyncio's own event loop, not {type(loop)}")
    quiet = 0
    for _ in range(turns):
        await asyncio.sleep(0)
        # Nothing ready after this task's turn: everyone else waits. Twice in a row, so
        # the loop has also polled for I/O and due timers once in between.
        quiet = quiet + 1 if not ready else 0
        if quiet == 2:
            return
    raise NeverHappened(f"the event loop still had work ready after {turns} turns")
