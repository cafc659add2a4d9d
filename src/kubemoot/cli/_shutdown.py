"""Graceful shutdown on SIGTERM and SIGINT, for every long-running command.

Kubernetes stops a pod with SIGTERM; a person stops a command with Ctrl-C (SIGINT).
Both must end the same way: the command's main coroutine is cancelled, so its
``finally`` blocks run while the store is still open (tickets released, intents
withdrawn, the store closed last), and the process exits soon after. A command uses
it in place of ``asyncio.run``::

    run_until_stopped(serve(...), grace_seconds=settings.process.shutdown_grace_seconds)

The first signal cancels the main coroutine; when it has ended, :class:`Stopped` is
raised, which the CLI's ``main`` turns into one line (``interrupted`` or
``terminated``) and exit status 128 + the signal's number. Shutdown is bounded: a
second signal, or the grace period running out, ends the process at once, because a
command that hangs on its way out is what makes Kubernetes send SIGKILL anyway.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["STOP_SIGNALS", "Stopped", "run_until_stopped"]

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The command was stopped by a signal after shutting down cleanly."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(self.describe())

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 plus the signal's number (130 for Ctrl-C)."""
        return 128 + self.signum

    def describe(self) -> str:
        return "interrupted" if self.signum == signal.SIGINT else "terminated"


def run_until_stopped(
    main: Coroutine[Any, Any, T], *, grace_seconds: float,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """Run ``main`` like ``asyncio.run``; SIGTERM or SIGINT stop it cleanly.

    ``grace_seconds`` (the process's ``shutdown_grace_seconds``, as its entry point
    read it) bounds the shutdown that a signal starts; ``loop_factory`` makes the event
    loop (asyncio's own by default). Raises :class:`Stopped` after a clean stop; returns
    ``main``'s result otherwise.
    """
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_guarded(main, grace_seconds))


async def _guarded(main: Coroutine[Any, Any, T], grace_seconds: float) -> T:
    loop = asyncio.get_running_loop()
    # main runs inside this very task (awaited, not wrapped in a task of its own), so
    # code that looks at "the other tasks" at shutdown never finds a parent waiting
    # on it.
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []
    deadline: list[threading.Timer] = []

    def on_signal(signum: int) -> None:
        if received:
            _exit_now(signum, "a second signal")
        received.append(signum)
        # A thread, not the loop: a loop stuck in someone's blocking call must not be
        # able to hold the process past its grace.
        timer = threading.Timer(grace_seconds, _exit_now,
                                args=(signum, f"shutdown took over {grace_seconds:g} s"))
        timer.daemon = True
        timer.start()
        deadline.append(timer)
        task.cancel()

    installed = []
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
    try:
        try:
            result = await main
        except asyncio.CancelledError:
            if received:
                raise Stopped(received[0]) from None
            raise
        if received:  # main caught the cancellation and returned: still a stop
            raise Stopped(received[0])
        return result
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
        for timer in deadline:
            timer.cancel()


def _exit_now(signum: int, why: str) -> None:
    """End the process without further cleanup (the bound on a shutdown)."""
    os.write(2, f"{why}; exiting now\n".encode())
    os._exit(128 + signum)
