"""A process's lifecycle: what it started, stopped in the one safe order.

Every long-running command (demo, gateway, agent, operator, dashboard) starts the same
kinds of things and must stop them so that nothing still running finds something it
needs already closed. :class:`Lifecycle` records each thing under its :class:`Stage`
as it starts, and :meth:`Lifecycle.shutdown` stops the stages in this order:

1. ``TASKS`` — the process's own tasks are cancelled and awaited: cancelling the work
   cancels every call in flight, and each call gives its ticket back while the store
   is still open.
2. ``RUNTIME`` — what serves or watches (the runtime stack, a dashboard page): its
   watches and followers stop, its own clients close.
3. stragglers — what the runtime started on its own (ticket lanes, call-log writes,
   preloads) gets ``straggler_grace`` seconds to finish against the still-open store,
   then is cancelled as well. Only tasks running kubemoot code count: the store's own
   tasks (a NATS client's reader) end when the store closes, last.
4. ``CLIENTS`` — provider clients, so no connection stays open.
5. ``EMULATORS`` — emulated engines, after every client that could still call them.
6. ``STORE`` — last: nothing is left that could still write to it.

Within a stage things stop in the reverse order of their start. A failure to stop one
thing is logged and does not keep the others running. The module imports nothing else
of ours, so any entry point can use it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from enum import IntEnum
from pathlib import Path
from typing import Any

__all__ = ["Lifecycle", "Stage", "finish_stragglers"]

log = logging.getLogger(__name__)

_PACKAGE = Path(__file__).parent

Stop = Callable[[], Awaitable[None]]


class Stage(IntEnum):
    """When a thing stops, in shutdown order (stragglers are handled between RUNTIME
    and CLIENTS)."""

    TASKS = 1
    RUNTIME = 2
    CLIENTS = 4
    EMULATORS = 5
    STORE = 6


class Lifecycle:
    """What a process has started so far, and how to stop it (see the module docstring).

    Register each thing as soon as it has started, so an interrupted start still stops
    every one that came up::

        process = Lifecycle(straggler_grace=settings.straggler_grace_seconds)
        try:
            kv = await open_store(...)
            process.on_stop(Stage.STORE, kv.close)
            ...
            process.add_task(asyncio.create_task(prober.run(interval)))
        finally:
            await process.shutdown()
    """

    def __init__(self, *, straggler_grace: float) -> None:
        self.straggler_grace = straggler_grace
        self.tasks: list[asyncio.Task[Any]] = []
        self._stops: list[tuple[Stage, str, Stop]] = []
        self.stopped: list[str] = []  # what has been stopped, in order (for its report)
        self._shut = False

    def add_task(self, task: asyncio.Task[Any], *, first: bool = False) -> asyncio.Task[Any]:
        """A task of the process, cancelled and awaited first at shutdown (``first``:
        before those added earlier, e.g. the main work before its helpers)."""
        if first:
            self.tasks.insert(0, task)
        else:
            self.tasks.append(task)
        return task

    def on_stop(self, stage: Stage, stop: Stop, *, name: str | None = None) -> None:
        """Call ``stop`` in ``stage`` at shutdown."""
        if stage is Stage.TASKS:
            raise ValueError("tasks are added with add_task; they are cancelled, not stopped")
        self._stops.append((stage, name or str(getattr(stop, "__qualname__", stop)), stop))

    def stop_in_thread(self, stage: Stage, stop: Callable[[], None], *,
                       name: str | None = None) -> None:
        """A blocking ``stop`` (a server in its own thread), run off the event loop."""
        async def stopping() -> None:
            await asyncio.to_thread(stop)
        self.on_stop(stage, stopping, name=name or getattr(stop, "__qualname__", None))

    async def shutdown(self) -> None:
        """Stop everything in the order of the module docstring; a second call does
        nothing."""
        if self._shut:
            return
        self._shut = True
        for task in self.tasks:
            task.cancel()
        await _settle(self.tasks)
        self.stopped.append("tasks")
        await self._stop_stage(Stage.RUNTIME)
        await finish_stragglers(self.straggler_grace)
        self.stopped.append("stragglers")
        for stage in (Stage.CLIENTS, Stage.EMULATORS, Stage.STORE):
            await self._stop_stage(stage)

    async def _stop_stage(self, stage: Stage) -> None:
        for registered, name, stop in reversed(self._stops):
            if registered is not stage:
                continue
            try:
                await stop()
            except Exception:  # one failure must not keep the rest running
                log.warning("stopping %s failed", name, exc_info=True)
            self.stopped.append(name)


async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait for ``tasks`` to end; their errors are theirs (already reported or moot)."""
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def finish_stragglers(grace: float) -> None:
    """Give the runtime's leftover tasks ``grace`` seconds, then cancel and await them.

    Only tasks running kubemoot code outside the store count. Finishing one task may
    start another (a claim granted to a caller that had gone away starts the release
    of that orphan), so this looks again until none is left.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    current = asyncio.current_task()
    while True:
        others = [t for t in asyncio.all_tasks() if t is not current and _runtime_task(t)]
        if not others:
            return
        remaining = deadline - loop.time()
        if remaining <= 0:
            for task in others:
                task.cancel()
            await _settle(others)
            return
        await asyncio.wait(others, timeout=remaining)


def _runtime_task(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    if code is None:
        return False
    where = Path(code.co_filename)
    return where.is_relative_to(_PACKAGE) and not where.is_relative_to(_PACKAGE / "store")
