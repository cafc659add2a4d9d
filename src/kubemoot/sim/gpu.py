"""Emulated GPUs running an Ollama-like engine, in virtual time.

Each :class:`EmulatedGpu` holds VRAM, loads models at a load rate, unloads in a fixed
time, gives each resident model ``max_parallel`` slots (``OLLAMA_NUM_PARALLEL`` is per
model runner) and queues calls beyond them. A model that arrives at a full card gets
Ollama's own behaviour: requests are taken in arrival order by one scheduler; when the
head request's model does not fit, idle models are evicted one at a time, the one whose
keep-alive runs out soonest first, and loads happen one after another. Idle models
leave after their keep-alive.

The engine checks its own VRAM on every change: resident plus loading memory never
exceeds usable memory (total − reserve); a violation raises :class:`VramOvercommit`,
which fails the simulation rather than producing a flattering report.

It implements :class:`kubemoot.providers.protocol.ProviderClient`, so the production
runtime drives it exactly like an Ollama endpoint. All waiting goes through the running
loop (virtual under the simulator).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubemoot.providers._emulation import OLLAMA_KEEP_ALIVE_SECONDS
from kubemoot.providers.protocol import ChatResult, LoadedModel, ProviderError, ProviderState
from kubemoot.runtime.settings import DEFAULTS
from kubemoot.sim.phases import CURRENT_CALL

__all__ = ["EmulatedGpu", "GpuEvents", "VramOvercommit"]


class VramOvercommit(AssertionError):
    """The engine would hold more memory than the card has: a simulator or policy bug."""


class GpuEvents:
    """Hooks the metrics recorder implements; the default does nothing."""

    def load_started(self, gpu: str, model: str, mib: int, at: float) -> None: ...

    def unloaded(self, gpu: str, model: str, reason: str, at: float) -> None: ...

    def call_started(self, gpu: str, model: str, at: float) -> None: ...


@dataclass(slots=True, eq=False)
class _Runner:
    model: str
    size_mib: int
    state: str  # loading | ready | unloading
    ready: asyncio.Event
    gone: asyncio.Event
    refs: int = 0  # requests assigned to this runner and not yet finished
    active: int = 0  # requests computing in a slot
    slot_waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    expires_at: float = float("inf")
    last_used: float = 0.0
    idle_token: int = 0
    unload_when_idle: bool = False


@dataclass(slots=True, eq=False)
class _Request:
    model: str
    future: asyncio.Future[_Runner]


class EmulatedGpu:
    """One simulated card with an Ollama-like scheduler (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        vram_mib: int,
        sizes_mib: Mapping[str, int],
        reserve_mib: int = DEFAULTS.reserve_mib,
        max_parallel: int = 1,
        load_rate_mibps: float = DEFAULTS.load_rate_mibps,
        unload_seconds: float = DEFAULTS.unload_seconds,
        keep_alive_seconds: float = OLLAMA_KEEP_ALIVE_SECONDS,
        context_length: int | None = None,
        events: GpuEvents | None = None,
        epoch: float = 0.0,
    ) -> None:
        self.name = name
        self.epoch = epoch  # Unix time of loop time 0, for the documents' timestamps
        self.endpoint = f"sim://{name}"
        self.vram_mib = vram_mib
        self.reserve_mib = reserve_mib
        self.usable_mib = vram_mib - reserve_mib
        self.max_parallel = max_parallel
        self.load_rate_mibps = load_rate_mibps
        self.unload_seconds = unload_seconds
        self.keep_alive_seconds = keep_alive_seconds
        self.context_length = context_length
        self._sizes = dict(sizes_mib)
        self._events = events or GpuEvents()
        self._runners: dict[str, _Runner] = {}
        self._pending: deque[_Request] = deque()
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.used_mib = 0
        self.peak_mib = 0
        self.vram_checks = 0
        self._busy_count = 0
        self._busy_since = 0.0
        self.busy_seconds = 0.0
        self._footprints: dict[str, int] = {}
        self._listeners: list[Callable[[], None]] = []
        # Running totals of time spent unloading / loading (unloading counts first), so a
        # queued call can tell what its time in the queue was spent on (sim.phases).
        self._activity_at = 0.0
        self.evicting_seconds = 0.0
        self.loading_seconds = 0.0

    # -- observation -----------------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def on_residency_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever the set of resident models changes."""
        self._listeners.append(listener)

    def resident(self) -> dict[str, str]:
        """model → state (loading, ready, unloading)."""
        return {m: r.state for m, r in self._runners.items()}

    def is_warm(self, model: str) -> bool:
        runner = self._runners.get(model)
        return runner is not None and runner.state != "unloading"

    def queue_depth(self) -> int:
        """Requests waiting or computing here (what a router polling the engine sees)."""
        return len(self._pending) + sum(r.refs for r in self._runners.values())

    def free_mib(self) -> int:
        return self.usable_mib - self.used_mib

    def finish_busy(self, at: float) -> None:
        if self._busy_count > 0:
            self.busy_seconds += at - self._busy_since
            self._busy_since = at

    def _busy(self, delta: int) -> None:
        now = self._now()
        if self._busy_count == 0 and delta > 0:
            self._busy_since = now
        self._busy_count += delta
        if self._busy_count == 0:
            self.busy_seconds += now - self._busy_since

    def _activity(self) -> tuple[float, float]:
        """Bring the unloading/loading totals up to now and return them."""
        now = self._now()
        elapsed = now - self._activity_at
        if elapsed > 0:
            states = [r.state for r in self._runners.values()]
            if "unloading" in states:
                self.evicting_seconds += elapsed
            elif "loading" in states:
                self.loading_seconds += elapsed
        self._activity_at = now
        return self.evicting_seconds, self.loading_seconds

    def _vram(self, delta: int) -> None:
        self.used_mib += delta
        self.vram_checks += 1
        if self.used_mib > self.usable_mib or self.used_mib < 0:
            raise VramOvercommit(
                f"{self.name}: {self.used_mib} MiB in use of {self.usable_mib} MiB usable"
            )
        self.peak_mib = max(self.peak_mib, self.used_mib)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _residency_changed(self) -> None:
        for listener in self._listeners:
            listener()

    # -- the scheduler (Ollama's behaviour) --------------------------------------------

    def _ensure_scheduler(self) -> None:
        if self._task is None:
            self._changed = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._schedule())

    async def _schedule(self) -> None:
        assert self._changed is not None
        while True:
            self._changed.clear()
            while self._pending and self._place_head():
                pass
            await self._changed.wait()

    def _place_head(self) -> bool:
        """Try to give the head request a runner; False when it must wait for a change."""
        request = self._pending[0]
        if request.future.done():  # cancelled by its caller
            self._pending.popleft()
            return True
        runner = self._runners.get(request.model)
        if runner is not None:
            if runner.state == "unloading":
                return False
            runner.refs += 1
            runner.idle_token += 1
            self._pending.popleft()
            request.future.set_result(runner)
            return True
        size = self._sizes[request.model]
        if size > self.usable_mib:
            self._pending.popleft()
            request.future.set_exception(
                ProviderError(f"model {request.model} needs {size} MiB, the card has "
                              f"{self.usable_mib} MiB usable", provider=self.name)
            )
            return True
        if any(r.state == "loading" for r in self._runners.values()):
            return False  # loads happen one at a time
        if size <= self.free_mib():
            runner = self._start_load(request.model, size)
            runner.refs += 1
            self._pending.popleft()
            request.future.set_result(runner)
            return True
        if any(r.state == "unloading" for r in self._runners.values()):
            return False  # memory is on its way back
        idle = [r for r in self._runners.values() if r.state == "ready" and r.refs == 0]
        if idle:
            victim = min(idle, key=lambda r: (r.expires_at, r.last_used, r.model))
            self._start_unload(victim, "evicted")
        return False

    def _start_load(self, model: str, size: int) -> _Runner:
        self._activity()
        runner = _Runner(model, size, "loading", asyncio.Event(), asyncio.Event())
        self._runners[model] = runner
        self._vram(size)
        self._busy(+1)
        self._events.load_started(self.name, model, size, self._now())
        asyncio.get_running_loop().create_task(self._load(runner))
        return runner

    async def _load(self, runner: _Runner) -> None:
        await asyncio.sleep(runner.size_mib / self.load_rate_mibps)
        self._activity()
        runner.state = "ready"
        runner.last_used = self._now()
        self._footprints.setdefault(runner.model, runner.size_mib)
        self._busy(-1)
        runner.ready.set()
        self._residency_changed()
        self._notify()
        if runner.refs == 0:
            self._became_idle(runner)

    def _start_unload(self, runner: _Runner, reason: str) -> None:
        self._activity()
        runner.state = "unloading"
        asyncio.get_running_loop().create_task(self._unload(runner, reason))

    async def _unload(self, runner: _Runner, reason: str) -> None:
        self._residency_changed()  # it stops being offered at once
        await asyncio.sleep(self.unload_seconds)
        self._activity()
        del self._runners[runner.model]
        self._vram(-runner.size_mib)
        self._events.unloaded(self.name, runner.model, reason, self._now())
        runner.gone.set()
        self._residency_changed()
        self._notify()

    def _became_idle(self, runner: _Runner) -> None:
        now = self._now()
        runner.last_used = now
        if runner.unload_when_idle:
            self._start_unload(runner, "unloaded")
            return
        runner.expires_at = now + self.keep_alive_seconds
        runner.idle_token += 1
        token = runner.idle_token
        asyncio.get_running_loop().call_later(
            self.keep_alive_seconds, self._expire, runner, token
        )
        self._notify()

    def _expire(self, runner: _Runner, token: int) -> None:
        if runner.state == "ready" and runner.refs == 0 and runner.idle_token == token:
            self._start_unload(runner, "expired")

    # -- requests --------------------------------------------------------------------

    async def _acquire(self, model: str) -> _Runner:
        if model not in self._sizes:
            raise ProviderError(f"unknown model {model}", provider=self.name)
        self._ensure_scheduler()
        phases = CURRENT_CALL.get()
        evicting, loading = self._activity()
        if phases is not None and phases.engine_request is None:
            phases.engine_request = self._now()
        future: asyncio.Future[_Runner] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(model, future))
        self._notify()
        runner = await future
        if phases is not None:
            evicting_after, loading_after = self._activity()
            phases.queue_evicting += evicting_after - evicting
            phases.queue_loading += loading_after - loading
            if phases.engine_assigned is None:
                phases.engine_assigned = self._now()
        await runner.ready.wait()
        if phases is not None and phases.runner_ready is None:
            phases.runner_ready = self._now()
        return runner

    def _release(self, runner: _Runner) -> None:
        runner.refs -= 1
        if runner.refs == 0 and runner.state == "ready":
            self._became_idle(runner)
        self._notify()

    async def serve(self, model: str, duration: float) -> float:
        """Run one call of ``duration`` seconds; returns when inference started."""
        runner = await self._acquire(model)
        try:
            if runner.active < self.max_parallel:
                runner.active += 1
            else:
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                runner.slot_waiters.append(waiter)
                await waiter  # the finishing call hands its slot over (active unchanged)
            started = self._now()
            phases = CURRENT_CALL.get()
            if phases is not None:
                phases.started = started
            self._events.call_started(self.name, model, started)
            self._busy(+1)
            try:
                await asyncio.sleep(duration)
            finally:
                self._busy(-1)
                self._hand_over_slot(runner)
            return started
        finally:
            self._release(runner)

    @staticmethod
    def _hand_over_slot(runner: _Runner) -> None:
        while runner.slot_waiters:
            waiter = runner.slot_waiters.popleft()
            if not waiter.done():  # a waiter cancelled at shutdown is skipped
                waiter.set_result(None)
                return
        runner.active -= 1

    # -- ProviderClient ----------------------------------------------------------------

    async def probe(self) -> ProviderState:
        return self.state_document(self.epoch + self._now())

    def state_document(self, probed_at: float) -> ProviderState:
        """What ``/api/ps`` would show now, as the provider-state document."""
        loaded = [
            LoadedModel(name=r.model, size_mib=r.size_mib, context_length=self.context_length,
                        expires_at=None if r.expires_at == float("inf")
                        else self.epoch + r.expires_at)
            for r in sorted(self._runners.values(), key=lambda r: r.model)
            if r.state == "ready"
        ]
        return ProviderState(
            provider=self.name, endpoint=self.endpoint, ready=True,
            last_probed_at=probed_at, total_vram_mib=self.vram_mib,
            used_vram_mib=self.used_mib, reserve_mib=self.reserve_mib,
            max_parallel=self.max_parallel, context_length=self.context_length,
            loaded_models=loaded, loaded_model_footprints=dict(self._footprints),
        )

    async def preload(self, model: str) -> None:
        runner = await self._acquire(model)
        self._release(runner)

    async def unload(self, model: str) -> None:
        runner = self._runners.get(model)
        if runner is None:
            return
        if runner.state == "ready" and runner.refs == 0:
            self._start_unload(runner, "unloaded")
        elif runner.state != "unloading":
            runner.unload_when_idle = True
        phases = CURRENT_CALL.get()
        began = self._now()
        await runner.gone.wait()
        if phases is not None:
            phases.policy_evicting += self._now() - began

    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        num_ctx: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> ChatResult:
        duration = float((options or {}).get("simDurationSeconds", 1.0))
        await self.serve(model, duration)
        return ChatResult(model=model, content="(simulated)", done_reason="stop")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
