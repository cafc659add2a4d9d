"""One model of an Ollama engine on one card, driven by an injected clock.

Both the Ollama-API emulator (:mod:`kubemoot.emulation.server`, over HTTP) and the
simulator's emulated GPUs (:mod:`kubemoot.sim.gpu`, in virtual time) run this model, so
the demo and the simulator mean the same thing by "load", "evict" and "queue". It keeps
the books Ollama's scheduler keeps:

* **Memory.** The card offers ``vram − reserve``. Loading, ready and unloading copies
  all hold their footprint; every change is checked and a card that would hold more
  than it offers raises :class:`VramOvercommit` (a bug, never a result).
* **One line per card.** Requests are placed in arrival order by one scheduler. The
  head request blocks the ones behind it while its model cannot be placed, as in
  Ollama, and a full line (``max_queue``) refuses new requests with :class:`QueueFull`.
* **Loads one at a time**, at the load rate (footprint / rate seconds). When the head's
  model does not fit, idle copies are unloaded one at a time, the one whose keep-alive
  ends soonest first, and the scheduler waits for the memory to come back.
* **Unloading takes time:** ``unload_seconds``, memory held meanwhile, and the copy is
  no longer offered.
* **Slots:** each ready copy has ``num_parallel`` slots; a finishing call hands its slot
  to the longest-waiting call of that copy.
* **Keep-alive** comes with each request (the card's default otherwise); an idle copy
  leaves when the keep-alive of its latest request runs out (never for ``inf``, at once
  for 0).
* **Context.** A copy's footprint is its weights plus a KV slab for ``context ×
  num_parallel`` tokens (:class:`ModelSize`); a request for another context length
  reloads an idle copy with the footprint of the new one. A prompt longer than the
  context is cut silently (:meth:`~kubemoot.emulation.prompt.Prompt.fit`, counted in
  :attr:`OllamaEngine.truncations`): the runtime must never let that happen, the model
  shows it when it does.
* **Prefill and the prompt-prefix cache.** Each slot keeps the prompt it last evaluated;
  a request takes the free slot that shares the longest prefix with its prompt (else
  the one unused longest), evaluates only the rest at ``prefill_seconds_per_token``
  (:meth:`OllamaEngine.prefill_seconds`), and leaves its own prompt there. A copy's
  caches go with the copy. :meth:`OllamaEngine.cached_prompts` shows what each slot
  holds, so a caller can confirm a hit.

All waiting goes through the clock, so the same code runs in virtual time (the
simulator's loop) and in scaled real time (the emulator). Callers learn what happened
to a request from the returned :class:`Assignment` and from :class:`EngineEvents`.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from kubemoot.clock import Clock
from kubemoot.emulation.prompt import FittedPrompt, Prompt, fit_to_context
from kubemoot.settings import DEFAULTS

__all__ = [
    "OLLAMA_KEEP_ALIVE_SECONDS",
    "Assignment",
    "CardSpec",
    "CopyState",
    "EngineCopy",
    "EngineError",
    "EngineEvents",
    "ModelExceedsCard",
    "ModelSize",
    "OllamaEngine",
    "Prompt",
    "QueueFull",
    "SlotGrant",
    "UnloadReason",
    "VramOvercommit",
    "fit_to_context",
]

#: Ollama's default keep-alive: an idle model stays loaded this long.
OLLAMA_KEEP_ALIVE_SECONDS = 300.0


class VramOvercommit(AssertionError):
    """The engine would hold more memory than the card offers: a bug in the engine or in
    whoever drives it, never a result to report."""


class EngineError(Exception):
    """A request the engine refuses."""


class ModelExceedsCard(EngineError):
    """The model's footprint exceeds everything the card offers."""

    def __init__(self, model: str, need_mib: int, usable_mib: int) -> None:
        super().__init__(f"model {model} needs {need_mib} MiB, the card has "
                         f"{usable_mib} MiB usable")
        self.model, self.need_mib, self.usable_mib = model, need_mib, usable_mib


class QueueFull(EngineError):
    """The card's line holds ``max_queue`` requests already (Ollama answers 503)."""


class CopyState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"


# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read under callgrind, a module global about
# 150): the members read once or more per call are kept at module level.
_LOADING, _READY, _UNLOADING = CopyState.LOADING, CopyState.READY, CopyState.UNLOADING


class UnloadReason(StrEnum):
    EVICTED = "evicted"  # pushed out by the engine because the head request needed room
    EXPIRED = "expired"  # its keep-alive ran out
    UNLOADED = "unloaded"  # asked for (keep_alive 0, or an unload request)
    RELOAD = "reload"  # to load again with another context length


@dataclass(frozen=True, slots=True)
class CardSpec:
    """The numbers that decide what one card's engine does."""

    vram_mib: int
    reserve_mib: int = DEFAULTS.reserve_mib
    num_parallel: int = 1
    load_rate_mibps: float = DEFAULTS.load_rate_mibps
    unload_seconds: float = DEFAULTS.unload_seconds
    keep_alive_seconds: float = OLLAMA_KEEP_ALIVE_SECONDS
    max_queue: int | None = None  # None: the line is unbounded
    #: seconds to evaluate one prompt token a slot's cache does not hold
    prefill_seconds_per_token: float = DEFAULTS.prefill_seconds_per_token

    def __post_init__(self) -> None:
        if self.reserve_mib < 0:
            raise ValueError(f"card reserve_mib must be 0 or more, got {self.reserve_mib}")
        if self.usable_mib <= 0:
            raise ValueError(f"card reserve_mib ({self.reserve_mib}) must be less than "
                             f"vram_mib ({self.vram_mib})")
        if self.num_parallel < 1:
            raise ValueError(f"card num_parallel must be 1 or more, got {self.num_parallel}")
        if not self.load_rate_mibps > 0:
            raise ValueError(f"card load_rate_mibps must be positive, "
                             f"got {self.load_rate_mibps}")
        if not self.prefill_seconds_per_token >= 0:
            raise ValueError(f"card prefill_seconds_per_token must be 0 or more, "
                             f"got {self.prefill_seconds_per_token}")

    @property
    def usable_mib(self) -> int:
        return self.vram_mib - self.reserve_mib


@dataclass(frozen=True, slots=True)
class ModelSize:
    """What a model's copy holds: its weights, and a KV slab of ``kv_mib_per_1k_tokens``
    per 1024 tokens of ``context × num_parallel``, reserved at load as Ollama does."""

    weights_mib: int
    kv_mib_per_1k_tokens: float = 0.0

    def footprint_mib(self, context_length: int | None, num_parallel: int) -> int:
        """The copy's memory; a context that is not said adds no slab (the size given
        is then the whole footprint)."""
        if context_length is None:
            return self.weights_mib
        slab = self.kv_mib_per_1k_tokens * context_length * num_parallel / 1024
        return self.weights_mib + math.ceil(slab)


@dataclass(slots=True)
class _SlotCache:
    """One slot of a copy: busy or not, and the prompt it evaluated last."""

    busy: bool = False
    prompt: Prompt | None = None
    last_used: float = -math.inf


@dataclass(frozen=True, slots=True)
class SlotGrant:
    """A slot given to a request, and what its cache saved the request."""

    index: int
    waited: bool  # all slots were busy when it asked
    cached_tokens: int  # of its prompt, held by the slot from the previous request
    uncached_tokens: int  # what the slot must evaluate (prefill)


class EngineEvents:
    """What an observer of the card hears; the default hears nothing."""

    def load_started(self, model: str, mib: int, at: float) -> None: ...

    def unloaded(self, model: str, reason: UnloadReason, at: float) -> None: ...


@dataclass(slots=True, eq=False)
class EngineCopy:
    """One model resident on the card (loading, ready or unloading)."""

    model: str
    footprint_mib: int
    context_length: int | None
    load_seconds: float
    keep_alive: float
    state: CopyState = CopyState.LOADING
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    refs: int = 0  # requests assigned to this copy and not yet released
    active: int = 0  # requests computing in a slot
    slot_waiters: deque[asyncio.Future[int]] = field(default_factory=deque)
    slots: list[_SlotCache] = field(default_factory=list)  # per slot: busy, its prompt
    expires_at: float = math.inf  # while in use it never expires
    last_used: float = 0.0
    idle_token: int = 0  # a keep-alive timer fires only if the copy stayed idle since
    unload_when_idle: bool = False


class Assignment(NamedTuple):
    """What the card did with one request, in clock seconds (a tuple: one is made per
    request, and a frozen dataclass sets each field through ``object.__setattr__``)."""

    copy: EngineCopy
    requested_at: float  # it joined the card's line
    assigned_at: float  # the scheduler gave it a copy
    ready_at: float  # that copy's model was ready
    queue_evicting: float  # time in line while the card was unloading
    queue_loading: float  # time in line while the card was loading another model
    loaded: bool  # this request started the copy's load
    waited: bool  # it waited in line, for memory, or for someone else's load


@dataclass(slots=True, eq=False)
class _Request:
    model: str
    footprint_mib: int
    context_length: int | None
    keep_alive: float
    future: asyncio.Future[EngineCopy]
    blocked_passes: int  # the card's count of blocked passes when it joined
    loaded: bool = False


class OllamaEngine:
    """One card's engine (see the module docstring)."""

    def __init__(self, name: str, card: CardSpec, *, clock: Clock,
                 events: EngineEvents | None = None) -> None:
        self.name = name
        self.card = card
        self.clock = clock
        self._events: list[EngineEvents] = [events] if events is not None else []
        self.copies: dict[str, EngineCopy] = {}
        self._pending: deque[_Request] = deque()
        # The scheduler's wake-up: asyncio.Event's flag and one waiter, kept here (the
        # scheduler is its only waiter, and every change of the card sets it)
        self._changed = False
        self._wakeup: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: list[Callable[[], None]] = []
        self._watchers: list[Callable[[], None]] = []
        self._blocked_passes = 0
        self.used_mib = 0
        self.peak_mib = 0
        self.vram_checks = 0
        self.footprints: dict[str, int] = {}  # model → footprint when first ready
        self.truncations = 0  # prompts cut to their context (the runtime should prevent it)
        self._busy_count = 0
        self._busy_since = 0.0
        self.busy_seconds = 0.0  # time the card was loading or computing
        # Running totals of time spent unloading / loading (unloading counts first), so
        # a request can tell what its time in line was spent on.
        self._activity_at = 0.0
        self.evicting_seconds = 0.0
        self.loading_seconds = 0.0

    # -- observation -------------------------------------------------------------------

    @property
    def usable_mib(self) -> int:
        return self.card.usable_mib

    def free_mib(self) -> int:
        return self.usable_mib - self.used_mib

    def observe(self, events: EngineEvents) -> None:
        """Tell ``events`` too about every load and unload from now on."""
        self._events.append(events)

    def on_residency_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever what ``/api/ps`` shows changes: the set of offered
        copies, or when a copy's keep-alive now ends (renewed as it turns idle)."""
        self._listeners.append(listener)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after any change a watcher may wait for: a request joining
        or leaving, a slot taken or given back, a copy loaded or gone."""
        self._watchers.append(listener)

    def waiting(self) -> int:
        """Requests in line for a copy or for a slot of one."""
        # list() copies in one step, so another thread (a test watching the emulator)
        # may ask while the card's own thread changes the line
        in_line = sum(1 for r in list(self._pending) if not r.future.done())
        return in_line + sum(sum(1 for w in list(c.slot_waiters) if not w.done())
                             for c in list(self.copies.values()))

    def queue_depth(self) -> int:
        """Requests in line or assigned to a copy (what a router polling the card sees)."""
        return len(self._pending) + sum(c.refs for c in self.copies.values())

    def finish_busy(self, at: float) -> None:
        if self._busy_count > 0:
            self.busy_seconds += at - self._busy_since
            self._busy_since = at

    def _busy(self, delta: int) -> None:
        now = self.clock.now()
        if self._busy_count == 0 and delta > 0:
            self._busy_since = now
        self._busy_count += delta
        if self._busy_count == 0:
            self.busy_seconds += now - self._busy_since

    def _activity(self) -> tuple[float, float]:
        """Bring the unloading/loading totals up to now and return them."""
        now = self.clock.now()
        elapsed = now - self._activity_at
        if elapsed > 0:
            states = [c.state for c in self.copies.values()]
            if _UNLOADING in states:
                self.evicting_seconds += elapsed
            elif _LOADING in states:
                self.loading_seconds += elapsed
        self._activity_at = now
        return self.evicting_seconds, self.loading_seconds

    def _vram(self, delta: int) -> None:
        self.used_mib += delta
        self.vram_checks += 1
        if self.used_mib > self.usable_mib or self.used_mib < 0:
            raise VramOvercommit(
                f"{self.name}: {self.used_mib} MiB in use of {self.usable_mib} MiB usable")
        self.peak_mib = max(self.peak_mib, self.used_mib)

    def _notify(self) -> None:
        if not self._changed:
            self._changed = True
            wakeup = self._wakeup
            if wakeup is not None and not wakeup.done():
                wakeup.set_result(None)  # the scheduler runs on the next turn, as on a set Event
        # The watchers are called here and where a slot is taken or given back, not
        # through a method of their own: a call fewer per change (about 6,900 a run)
        for watcher in self._watchers:
            watcher()

    def _residency_changed(self) -> None:
        for listener in self._listeners:
            listener()

    # -- the scheduler -----------------------------------------------------------------

    def _ensure_scheduler(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._loop is not loop:
            self._loop = loop
            self._changed = False
            self._wakeup = None
            self._task = loop.create_task(self._schedule(loop))

    async def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            self._changed = False
            while self._pending and self._place_head():
                pass
            if self._pending:
                self._blocked_passes += 1
            if not self._changed:  # a change during the pass: pass again at once
                self._wakeup = loop.create_future()
                try:
                    await self._wakeup
                finally:
                    self._wakeup = None

    def _place_head(self) -> bool:
        """Try to give the head request a copy; False when it must wait for a change."""
        request = self._pending[0]
        if request.future.done():  # cancelled by its caller
            self._pending.popleft()
            return True
        copy = self.copies.get(request.model)
        if copy is not None:
            if copy.state == _UNLOADING:
                return False
            if request.context_length is not None \
                    and copy.context_length != request.context_length:
                if copy.state == CopyState.READY and copy.refs == 0:
                    self._start_unload(copy, UnloadReason.RELOAD)
                return False  # another context: reload once its calls are done
            self._assign(request, copy)
            return True
        if request.footprint_mib > self.usable_mib:
            self._pending.popleft()
            request.future.set_exception(
                ModelExceedsCard(request.model, request.footprint_mib, self.usable_mib))
            return True
        if any(c.state == CopyState.LOADING for c in self.copies.values()):
            return False  # loads happen one at a time
        if request.footprint_mib <= self.free_mib():
            copy = self._start_load(request)
            request.loaded = True
            self._assign(request, copy)
            return True
        if any(c.state == CopyState.UNLOADING for c in self.copies.values()):
            return False  # memory is on its way back
        idle = [c for c in self.copies.values() if c.state == CopyState.READY and c.refs == 0]
        if idle:
            victim = min(idle, key=lambda c: (c.expires_at, c.last_used, c.model))
            # A copy whose keep-alive has run out goes now because it is due: only a
            # loop running late has not unloaded it yet, and no scheduler overcommitted
            # the card for it. Only a copy still kept alive is pushed out (evicted).
            due = victim.expires_at <= self.clock.now()
            self._start_unload(victim, UnloadReason.EXPIRED if due else UnloadReason.EVICTED)
        return False

    def _assign(self, request: _Request, copy: EngineCopy) -> None:
        copy.refs += 1
        copy.idle_token += 1
        copy.keep_alive = request.keep_alive  # the latest request's keep-alive counts
        self._pending.popleft()
        request.future.set_result(copy)

    def _start_load(self, request: _Request) -> EngineCopy:
        self._activity()
        size = request.footprint_mib
        copy = EngineCopy(request.model, size, request.context_length,
                          load_seconds=size / self.card.load_rate_mibps,
                          keep_alive=request.keep_alive,
                          slots=[_SlotCache() for _ in range(self.card.num_parallel)])
        self.copies[copy.model] = copy
        self._vram(size)
        self._busy(+1)
        for events in self._events:
            events.load_started(copy.model, size, self.clock.now())
        asyncio.get_running_loop().create_task(self._load(copy))
        return copy

    async def _load(self, copy: EngineCopy) -> None:
        await self.clock.sleep(copy.load_seconds)
        self._activity()
        copy.state = CopyState.READY
        copy.last_used = self.clock.now()
        self.footprints.setdefault(copy.model, copy.footprint_mib)
        self._busy(-1)
        copy.ready.set()
        self._residency_changed()
        self._notify()
        if copy.refs == 0:
            self._became_idle(copy)

    def _start_unload(self, copy: EngineCopy, reason: UnloadReason) -> None:
        self._activity()
        copy.state = CopyState.UNLOADING
        asyncio.get_running_loop().create_task(self._unload(copy, reason))

    async def _unload(self, copy: EngineCopy, reason: UnloadReason) -> None:
        self._residency_changed()  # it stops being offered at once
        await self.clock.sleep(self.card.unload_seconds)
        self._activity()
        del self.copies[copy.model]
        self._vram(-copy.footprint_mib)
        for events in self._events:
            events.unloaded(copy.model, reason, self.clock.now())
        copy.gone.set()
        self._residency_changed()
        self._notify()

    def _became_idle(self, copy: EngineCopy) -> None:
        now = self.clock.now()
        copy.last_used = now
        if copy.unload_when_idle or copy.keep_alive <= 0:
            self._start_unload(copy, UnloadReason.UNLOADED)
            return
        copy.expires_at = now + copy.keep_alive
        # A state document written from /api/ps must show the renewed end: a reader that
        # judges residency by it would otherwise see a copy in use as lapsed.
        self._residency_changed()
        copy.idle_token += 1
        if math.isfinite(copy.keep_alive):
            asyncio.get_running_loop().create_task(
                self._expire_after(copy, copy.keep_alive, copy.idle_token))
        self._notify()

    async def _expire_after(self, copy: EngineCopy, seconds: float, token: int) -> None:
        idle_since = self.clock.now()
        await self.clock.sleep(seconds)
        if self.clock.now() <= idle_since:
            # Time stands still (an emulator at time scale 0 finishes work at once, but
            # no instant after now ever comes): a keep-alive that never ran out.
            return
        if copy.state == _READY and copy.refs == 0 and copy.idle_token == token:
            self._start_unload(copy, UnloadReason.EXPIRED)

    # -- requests ----------------------------------------------------------------------

    def footprint_mib(self, size: ModelSize | int, context_length: int | None) -> int:
        """A copy's memory on this card: a bare number is the whole footprint."""
        if isinstance(size, int):
            return size
        return size.footprint_mib(context_length, self.card.num_parallel)

    async def acquire(self, model: str, size: ModelSize | int, *,
                      context_length: int | None = None,
                      keep_alive: float | None = None) -> Assignment:
        """Join the card's line for a copy of ``model`` and return once it is ready.

        The copy holds ``size`` for ``context_length`` (a bare number of MiB is the
        whole footprint). The caller holds the copy (it cannot be unloaded) until
        :meth:`release`. ``context_length`` None takes the copy whatever its context;
        ``keep_alive`` None is the card's default.
        """
        footprint_mib = self.footprint_mib(size, context_length)
        self._ensure_scheduler()
        limit = self.card.max_queue
        if limit is not None and self.waiting() >= limit:
            raise QueueFull(f"{self.name}: {limit} requests wait already")
        requested = self.clock.now()
        evicting, loading = self._activity()
        future: asyncio.Future[EngineCopy] = asyncio.get_running_loop().create_future()
        request = _Request(model, footprint_mib, context_length,
                           self.card.keep_alive_seconds if keep_alive is None else keep_alive,
                           future, self._blocked_passes)
        self._pending.append(request)
        self._notify()
        try:
            copy = await future
        except BaseException:
            # cancelled after the scheduler assigned it: give the copy back
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result())
            raise
        evicting_after, loading_after = self._activity()
        assigned = self.clock.now()
        was_ready = copy.state == _READY
        if not was_ready:  # a ready copy's event is set: waiting on it would return at once
            try:
                await copy.ready.wait()
            except BaseException:
                self.release(copy)
                raise
        blocked = self._blocked_passes != request.blocked_passes
        return Assignment(copy, requested, assigned, self.clock.now(),
                          evicting_after - evicting, loading_after - loading,
                          loaded=request.loaded,
                          waited=blocked or not (was_ready or request.loaded))

    def fit(self, prompt: Prompt, context_length: int | None) -> FittedPrompt:
        """``prompt`` as the engine evaluates it with ``context_length``: cut silently
        when it is longer, and counted in :attr:`truncations`."""
        fitted = prompt.fit(context_length)
        if fitted.truncated:
            self.truncations += 1
        return fitted

    async def take_slot(self, copy: EngineCopy, prompt: Prompt | None = None) -> SlotGrant:
        """Wait for one of the copy's slots and leave ``prompt`` in its cache.

        A free slot whose cache shares the longest prefix with ``prompt`` is taken,
        else the one unused longest; a request that waits gets the slot the next
        finishing call gives back. Give it back with :meth:`give_slot`.
        """
        free = [i for i, slot in enumerate(copy.slots) if not slot.busy]
        waited = not free
        if free:
            index = self._best_slot(copy, free, prompt)
            copy.slots[index].busy = True
            copy.active += 1
        else:
            waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            copy.slot_waiters.append(waiter)
            try:
                # the finishing call hands its slot over (active and busy unchanged)
                index = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._hand_over_slot(copy, waiter.result())  # pass it on
                raise
        slot = copy.slots[index]
        cached = prompt.shared_prefix(slot.prompt) if prompt is not None else 0
        slot.prompt = prompt
        slot.last_used = self.clock.now()
        self._busy(+1)
        for watcher in self._watchers:
            watcher()
        total = prompt.tokens if prompt is not None else 0
        return SlotGrant(index, waited, cached, total - cached)

    @staticmethod
    def _best_slot(copy: EngineCopy, free: list[int], prompt: Prompt | None) -> int:
        def preference(i: int) -> tuple[int, float, int]:
            slot = copy.slots[i]
            shared = prompt.shared_prefix(slot.prompt) if prompt is not None else 0
            return (-shared, slot.last_used, i)
        return min(free, key=preference)

    def prefill_seconds(self, grant: SlotGrant) -> float:
        """How long the slot evaluates the part of the prompt its cache did not hold."""
        return grant.uncached_tokens * self.card.prefill_seconds_per_token

    def cached_prompts(self, model: str) -> tuple[Prompt | None, ...]:
        """What each slot of ``model``'s copy holds (empty when no copy is resident)."""
        copy = self.copies.get(model)
        if copy is None or copy.state == CopyState.UNLOADING:
            return ()
        return tuple(slot.prompt for slot in copy.slots)

    def cached_tokens(self, model: str, prompt: Prompt) -> int:
        """The longest prefix of ``prompt`` a slot of ``model``'s copy holds now (what a
        call would skip on that slot; 0 when no copy is resident)."""
        return max((prompt.shared_prefix(p) for p in self.cached_prompts(model)), default=0)

    def give_slot(self, copy: EngineCopy, grant: SlotGrant) -> None:
        self._busy(-1)
        copy.slots[grant.index].last_used = self.clock.now()
        self._hand_over_slot(copy, grant.index)
        for watcher in self._watchers:
            watcher()

    @staticmethod
    def _hand_over_slot(copy: EngineCopy, index: int) -> None:
        while copy.slot_waiters:
            waiter = copy.slot_waiters.popleft()
            if not waiter.done():  # a waiter that gave up is skipped
                waiter.set_result(index)
                return
        copy.slots[index].busy = False
        copy.active -= 1

    def release(self, copy: EngineCopy) -> None:
        """The request is done with ``copy``; idle, the copy's keep-alive starts."""
        copy.refs -= 1
        if copy.refs == 0 and copy.state == _READY:
            self._became_idle(copy)
        self._notify()

    def unload(self, model: str) -> asyncio.Event | None:
        """Unload ``model`` now if idle, else once its calls finish (``keep_alive: 0``).

        Returns the event set when its memory is back, or None if it is not resident.
        """
        copy = self.copies.get(model)
        if copy is None:
            return None
        if copy.state == CopyState.READY and copy.refs == 0:
            self._start_unload(copy, UnloadReason.UNLOADED)
        elif copy.state != CopyState.UNLOADING:
            copy.unload_when_idle = True
        return copy.gone

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

