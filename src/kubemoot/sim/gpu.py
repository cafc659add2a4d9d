"""Emulated GPUs for the simulator: the shared engine model as a provider client.

Each :class:`EmulatedGpu` is one card running :class:`kubemoot.providers.engine.OllamaEngine`
(the same model of an Ollama engine the HTTP emulator runs) on the simulator's virtual
clock: memory with a reserve, one arrival-order line, loads one at a time, unloads that
take time, ``max_parallel`` slots per copy and keep-alive. A violation of the memory
invariant raises :class:`VramOvercommit`, which fails the simulation rather than
producing a flattering report.

It implements :class:`kubemoot.providers.protocol.ProviderClient`, so the production
runtime drives it exactly like an Ollama endpoint, and it writes where each call's wait
went into :data:`kubemoot.sim.phases.CURRENT_CALL`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubemoot.clock import LoopClock
from kubemoot.providers.engine import (
    OLLAMA_KEEP_ALIVE_SECONDS,
    CardSpec,
    EngineCopy,
    EngineError,
    EngineEvents,
    OllamaEngine,
    UnloadReason,
    VramOvercommit,
)
from kubemoot.providers.protocol import ChatResult, LoadedModel, ProviderError, ProviderState
from kubemoot.runtime.settings import DEFAULTS
from kubemoot.sim.phases import CURRENT_CALL

__all__ = ["EmulatedGpu", "GpuEvents", "VramOvercommit"]


class GpuEvents:
    """Hooks the metrics recorder implements; the default does nothing."""

    def load_started(self, gpu: str, model: str, mib: int, at: float) -> None: ...

    def unloaded(self, gpu: str, model: str, reason: str, at: float) -> None: ...

    def call_started(self, gpu: str, model: str, at: float) -> None: ...


class _CardEvents(EngineEvents):
    """The engine's events, told to the recorder with the card's name."""

    def __init__(self, gpu: str, events: GpuEvents) -> None:
        self._gpu, self._events = gpu, events

    def load_started(self, model: str, mib: int, at: float) -> None:
        self._events.load_started(self._gpu, model, mib, at)

    def unloaded(self, model: str, reason: UnloadReason, at: float) -> None:
        self._events.unloaded(self._gpu, model, reason.value, at)


class EmulatedGpu:
    """One simulated card (see the module docstring)."""

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
        self.context_length = context_length
        self._sizes = dict(sizes_mib)
        self._events = events or GpuEvents()
        card = CardSpec(vram_mib=vram_mib, reserve_mib=reserve_mib, num_parallel=max_parallel,
                        load_rate_mibps=load_rate_mibps, unload_seconds=unload_seconds,
                        keep_alive_seconds=keep_alive_seconds)
        # the engine counts in loop seconds; its books (used_mib, peak_mib, vram_checks,
        # busy_seconds) are read from it directly (virtual under the simulator), from loop time 0
        self.engine = OllamaEngine(name, card, clock=LoopClock(epoch=0.0, anchor=0.0),
                                   events=_CardEvents(name, self._events))

    # -- observation -----------------------------------------------------------------

    def on_residency_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever the set of resident models changes."""
        self.engine.on_residency_change(listener)

    def is_warm(self, model: str) -> bool:
        copy = self.engine.copies.get(model)
        return copy is not None and copy.state != "unloading"

    def queue_depth(self) -> int:
        """Requests waiting or computing here (what a router polling the engine sees)."""
        return self.engine.queue_depth()

    def free_mib(self) -> int:
        return self.engine.free_mib()

    # -- requests --------------------------------------------------------------------

    async def _acquire(self, model: str, keep_alive: float | None = None) -> EngineCopy:
        if model not in self._sizes:
            raise ProviderError(f"unknown model {model}", provider=self.name)
        try:
            got = await self.engine.acquire(model, self._sizes[model], keep_alive=keep_alive)
        except EngineError as error:  # the card refuses it (a model larger than the card)
            raise ProviderError(str(error), provider=self.name) from None
        phases = CURRENT_CALL.get()
        if phases is not None:
            if phases.engine_request is None:
                phases.engine_request = got.requested_at
            phases.queue_evicting += got.queue_evicting
            phases.queue_loading += got.queue_loading
            if phases.engine_assigned is None:
                phases.engine_assigned = got.assigned_at
            if phases.runner_ready is None:
                phases.runner_ready = got.ready_at
        return got.copy

    async def serve(self, model: str, duration: float, *,
                    keep_alive: float | None = None) -> float:
        """Run one call of ``duration`` seconds; returns when inference started.

        ``keep_alive`` is the request's (None: the card's default), as Ollama's field.
        """
        engine = self.engine
        copy = await self._acquire(model, keep_alive)
        try:
            await engine.take_slot(copy)
            started = engine.clock.now()
            phases = CURRENT_CALL.get()
            if phases is not None:
                phases.started = started
            self._events.call_started(self.name, model, started)
            try:
                await engine.clock.sleep(duration)
            finally:
                engine.give_slot(copy)
            return started
        finally:
            engine.release(copy)

    # -- ProviderClient ----------------------------------------------------------------

    async def probe(self) -> ProviderState:
        return self.state_document(self.epoch + self.engine.clock.now())

    def state_document(self, probed_at: float) -> ProviderState:
        """What ``/api/ps`` would show now, as the provider-state document."""
        loaded = [
            LoadedModel(name=c.model, size_mib=c.footprint_mib,
                        context_length=self.context_length,
                        expires_at=None if c.expires_at == float("inf")
                        else self.epoch + c.expires_at)
            for c in sorted(self.engine.copies.values(), key=lambda c: c.model)
            if c.state == "ready"
        ]
        return ProviderState(
            provider=self.name, endpoint=self.endpoint, ready=True,
            last_probed_at=probed_at, total_vram_mib=self.vram_mib,
            used_vram_mib=self.engine.used_mib, reserve_mib=self.reserve_mib,
            max_parallel=self.max_parallel, context_length=self.context_length,
            loaded_models=loaded, loaded_model_footprints=dict(self.engine.footprints),
        )

    async def preload(self, model: str, *, keep_alive: float | None = None) -> None:
        copy = await self._acquire(model, keep_alive)
        self.engine.release(copy)

    async def unload(self, model: str) -> None:
        """Returns once the model's memory is back (the simulator's policies count on it)."""
        gone = self.engine.unload(model)
        if gone is None:
            return
        phases = CURRENT_CALL.get()
        began = self.engine.clock.now()
        await gone.wait()
        if phases is not None:
            phases.policy_evicting += self.engine.clock.now() - began

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
        await self.engine.close()
