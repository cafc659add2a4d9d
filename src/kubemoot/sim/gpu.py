"""Emulated GPUs for the simulator: the shared engine model as a provider client.

Each :class:`EmulatedGpu` is one card running :class:`kubemoot.emulation.engine.OllamaEngine`
(the same model of an Ollama engine the HTTP emulator runs) on the simulator's virtual
clock: memory with a reserve, one arrival-order line, loads one at a time, unloads that
take time, ``max_parallel`` slots per copy, keep-alive, a footprint that grows with the
context, reload on a new ``num_ctx``, the silent cut of an over-long prompt, and prefill
with a per-slot prompt-prefix cache (:meth:`EmulatedGpu.serve_prompt`). A violation of
the memory invariant raises :class:`VramOvercommit`, which fails the simulation rather
than producing a flattering report.

It implements :class:`kubemoot.providers.protocol.ProviderClient`, so the production
runtime drives it exactly like an Ollama endpoint, and it writes where each call's wait
went into :data:`kubemoot.sim.phases.CURRENT_CALL`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from kubemoot.emulation.engine import (
    OLLAMA_KEEP_ALIVE_SECONDS,
    CardSpec,
    EngineCopy,
    EngineError,
    EngineEvents,
    ModelSize,
    OllamaEngine,
    UnloadReason,
    VramOvercommit,
)
from kubemoot.emulation.prompt import Prompt
from kubemoot.providers.protocol import ChatResult, ProviderError, ProviderState, ResidentModel
from kubemoot.settings import DEFAULTS
from kubemoot.sim.phases import CURRENT_CALL
from kubemoot.sim.vloop import loop_clock

__all__ = ["EmulatedGpu", "GpuEvents", "ModelSize", "Prompt", "ServedPrompt", "VramOvercommit"]


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


class ServedPrompt(NamedTuple):
    """What one call met on the card, in loop seconds (a tuple: one is made for every
    call the simulator serves, and a frozen dataclass sets each field through
    ``object.__setattr__``)."""

    started: float  # it got a slot: its prefill begins
    first_token_at: float  # its prefill is done: ``started`` + ``prefill_seconds``
    prefill_seconds: float  # evaluating what the slot's cache did not hold
    cached_tokens: int  # of its prompt, held by the slot from that slot's last call
    prompt_tokens: int  # what the engine evaluated (after a cut, if any)
    truncated: bool  # the prompt was longer than the context and was cut


class EmulatedGpu:
    """One simulated card (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        vram_mib: int,
        sizes_mib: Mapping[str, int | ModelSize],
        reserve_mib: int = DEFAULTS.reserve_mib,
        max_parallel: int = 1,
        load_rate_mibps: float = DEFAULTS.load_rate_mibps,
        unload_seconds: float = DEFAULTS.unload_seconds,
        keep_alive_seconds: float = OLLAMA_KEEP_ALIVE_SECONDS,
        prefill_seconds_per_token: float = DEFAULTS.prefill_seconds_per_token,
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
                        keep_alive_seconds=keep_alive_seconds,
                        prefill_seconds_per_token=prefill_seconds_per_token)
        # the engine counts in loop seconds; its books (used_mib, peak_mib, vram_checks,
        # busy_seconds) are read from it directly (virtual under the simulator), from loop time 0
        self.engine = OllamaEngine(name, card, clock=loop_clock(epoch=0.0, anchor=0.0),
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

    def context_for(self, num_ctx: int | None) -> int | None:
        """The context a call runs with: its own ``num_ctx``, else the card's."""
        return num_ctx if num_ctx is not None else self.context_length

    def cached_prompts(self, model: str) -> tuple[Prompt | None, ...]:
        """What each slot of ``model``'s copy caches now (empty when not resident): the
        engine's word on which thread's prefix it still holds."""
        return self.engine.cached_prompts(model)

    async def _acquire(self, model: str, num_ctx: int | None = None,
                       keep_alive: float | None = None) -> EngineCopy:
        if model not in self._sizes:
            raise ProviderError(f"unknown model {model}", provider=self.name)
        try:
            got = await self.engine.acquire(model, self._sizes[model],
                                            context_length=self.context_for(num_ctx),
                                            keep_alive=keep_alive)
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
                    keep_alive: float | None = None, prompt: Prompt | None = None) -> float:
        """Run one call of ``duration`` seconds; returns when generation started: the
        first token, once the prompt's uncached part was evaluated (prefill)."""
        served = await self.serve_prompt(model, duration, keep_alive=keep_alive, prompt=prompt)
        return served.first_token_at

    async def serve_prompt(self, model: str, duration: float, *,
                           prompt: Prompt | None = None,
                           num_ctx: int | None = None,
                           keep_alive: float | None = None) -> ServedPrompt:
        """Run one call: the engine cuts ``prompt`` to the context if it must, the slot
        evaluates what its cache does not hold (prefill), then ``duration`` seconds of
        generation. ``num_ctx`` other than the copy's reloads it, as Ollama does.
        ``keep_alive`` is the request's, as Ollama's field (None: the card's default)."""
        engine = self.engine
        context = self.context_for(num_ctx)
        fitted = engine.fit(prompt, context) if prompt is not None else None
        copy = await self._acquire(model, num_ctx, keep_alive)
        try:
            grant = await engine.take_slot(copy, fitted.prompt if fitted else None)
            started = engine.clock.now()
            phases = CURRENT_CALL.get()
            if phases is not None:
                phases.started = started
            self._events.call_started(self.name, model, started)
            prefill = engine.prefill_seconds(grant)
            if phases is not None:
                phases.first_token = started + prefill
            try:
                await engine.clock.sleep(prefill + duration)
            finally:
                engine.give_slot(copy, grant)
            return ServedPrompt(started, started + prefill, prefill, grant.cached_tokens,
                          fitted.tokens if fitted else 0,
                          fitted.truncated if fitted else False)
        finally:
            engine.release(copy)

    # -- ProviderClient ----------------------------------------------------------------

    async def probe(self) -> ProviderState:
        return self.state_document(self.epoch + self.engine.clock.now())

    def state_document(self, probed_at: float) -> ProviderState:
        """What ``/api/ps`` would show now, as the provider-state document."""
        loaded = [
            ResidentModel(name=c.model, size_mib=c.footprint_mib,
                        context_length=(c.context_length if c.context_length is not None
                                        else self.context_length),
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
        copy = await self._acquire(model, keep_alive=keep_alive)
        self.engine.release(copy)

    async def unload(self, model: str) -> None:
        """``keep_alive: 0``: answered at once, as Ollama does; the memory comes back
        ``unload_seconds`` later, and a load that needs it waits in the card's line."""
        self.engine.unload(model)

    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        num_ctx: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: float | None = None,
    ) -> ChatResult:
        duration = float((options or {}).get("simDurationSeconds", 1.0))
        served = await self.serve_prompt(model, duration, num_ctx=num_ctx)
        return ChatResult(model=model, content="(simulated)", done_reason="stop",
                          prompt_eval_count=served.prompt_tokens or None)

    async def close(self) -> None:
        await self.engine.close()
