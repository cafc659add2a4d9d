"""The emulated engine behind :mod:`kubemoot.providers.emulator` (no HTTP here).

It keeps the books an Ollama server keeps: which models occupy how much VRAM, how
long a load takes, how many parallel slots each loaded copy has and who waits in
line for them, when an idle copy expires, and how an over-long prompt is silently cut.
Everything is deterministic: durations are computed from the configuration (then
multiplied by ``time_scale`` for real waiting), replies are a hash of the question.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kubemoot.clock import Clock
from kubemoot.providers.durations import DurationError, duration_seconds
from kubemoot.runtime.settings import DEFAULTS

MIB = 1024 * 1024

ToolRule = Callable[[str, Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]],
                    list[dict[str, Any]] | None]


class EmulatorError(Exception):
    """An error the emulator answers with, as Ollama would (``{"error": …}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class EmulatedModel:
    """A model in the emulator's catalogue.

    ``kv_mib_per_1k_tokens`` sizes the KV slab reserved at load: that many MiB per 1024
    tokens of ``context_length × num_parallel`` (0 means the footprint is the weights).
    """

    name: str
    size_mib: int
    digest: str | None = None
    kv_mib_per_1k_tokens: float = 0.0
    family: str = "emulated"

    def footprint_mib(self, context_length: int, num_parallel: int) -> int:
        slab = self.kv_mib_per_1k_tokens * context_length * num_parallel / 1024
        return self.size_mib + math.ceil(slab)

    @property
    def manifest_digest(self) -> str:
        return self.digest or hashlib.sha256(self.name.encode()).hexdigest()


DEFAULT_MODELS: tuple[EmulatedModel, ...] = (
    EmulatedModel("qwen3:8b", 5120, kv_mib_per_1k_tokens=36.0, family="qwen3"),
    EmulatedModel("qwen3:14b", 9216, kv_mib_per_1k_tokens=40.0, family="qwen3"),
    EmulatedModel("qwen3:32b", 20480, kv_mib_per_1k_tokens=64.0, family="qwen3"),
)


#: Ollama's default keep-alive: an idle model stays loaded this long.
OLLAMA_KEEP_ALIVE_SECONDS = 300.0


@dataclass(slots=True)
class EmulatorConfig:
    """Everything the emulated engine does is decided by these numbers."""

    models: Sequence[EmulatedModel] = DEFAULT_MODELS
    vram_mib: int = 24576
    num_parallel: int = 1
    context_length: int = 4096
    load_rate_mibps: float = DEFAULTS.load_rate_mibps  # what the runtime assumes, too
    base_latency_s: float = 0.5  # per generation, before tokens
    per_token_s: float = 0.02  # per generated token
    prompt_per_token_s: float = 0.0  # per prompt token evaluated
    time_scale: float = 1.0  # multiplies every real wait (0.01 makes tests fast)
    keep_alive_s: float = OLLAMA_KEEP_ALIVE_SECONDS
    max_queue: int = 512  # Ollama's OLLAMA_MAX_QUEUE default
    chars_per_token: float = 4.0  # the emulator's deterministic tokenizer
    embedding_length: int = 384  # dimensions of every emulated embedding
    embed_latency_s: float = 0.05  # per embedding request, before prompt tokens
    tool_rule: ToolRule | None = None


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """What one generation request carried and what the engine did with it."""

    path: str
    model: str
    messages: list[dict[str, Any]]  # exactly as received
    num_ctx: int | None  # as requested in options
    context_length: int  # the context it ran with
    prompt_tokens: int  # estimated size of the whole prompt as sent
    prompt_tokens_evaluated: int  # after truncation; reported as prompt_eval_count
    truncated: bool
    dropped_messages: int
    tools: int
    queued: bool  # waited for a slot or for memory
    received_at: float
    error: str | None = None


@dataclass(eq=False)
class LoadedCopy:
    """One model resident (or loading) in emulated VRAM."""

    model: EmulatedModel
    context_length: int
    footprint_mib: int
    load_seconds: float
    expires_at: float
    loading: bool = True
    busy: int = 0
    line: deque[object] = field(default_factory=deque)  # FIFO of callers for a slot

    @property
    def idle(self) -> bool:
        return not self.loading and self.busy == 0 and not self.line


class Slot(NamedTuple):
    """What :meth:`EmulatorEngine.acquire` got for its caller."""

    copy: LoadedCopy
    waited: bool  # waited for a slot, a load by someone else, or memory
    loaded: bool  # this caller loaded the copy (and paid the load time)


def parse_keep_alive(value: object, default: float) -> float:
    """Ollama's keep_alive (:func:`~kubemoot.providers.durations.duration_seconds`); a
    bad one is a 400."""
    if value is None:
        return default
    try:
        return duration_seconds(value)
    except DurationError as error:
        raise EmulatorError(400, str(error)) from None


def embedding_vector(model: str, text: str, dimensions: int) -> list[float]:
    """A deterministic, unnormalised vector for ``text`` (a hash, not a meaning)."""
    values: list[float] = []
    block = 0
    while len(values) < dimensions:
        digest = hashlib.sha256(f"{model}\n{block}\n{text}".encode()).digest()
        values.extend((int.from_bytes(digest[i:i + 2], "big") - 32768) / 32768
                      for i in range(0, len(digest), 2))
        block += 1
    return values[:dimensions]


def normalised(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to unit length (Ollama's ``/api/embed`` answers these)."""
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else list(vector)


def _text_of(message: Mapping[str, Any]) -> str:
    parts = [str(message.get("content") or "")]
    if message.get("tool_calls"):
        parts.append(json.dumps(message["tool_calls"], sort_keys=True, default=str))
    return "".join(parts)


class EmulatorEngine:
    """VRAM, load time, slots and queue, truncation, deterministic replies."""

    MESSAGE_OVERHEAD_TOKENS = 4  # role markers and template per message

    def __init__(self, config: EmulatorConfig, *, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.catalogue = {m.name: m for m in config.models}
        self.copies: dict[str, LoadedCopy] = {}
        self._cond: asyncio.Condition | None = None
        self._cond_loop: asyncio.AbstractEventLoop | None = None
        self._books = threading.Lock()  # records and counters are read from other threads
        self._records: list[RecordedRequest] = []
        self.loads: list[str] = []
        self.evictions: list[str] = []  # pushed out by the engine because memory ran short
        self.reloads: list[str] = []  # unloaded to load again with another num_ctx
        self.truncations = 0  # requests whose prompt the engine cut
        self.peak_vram_mib = 0
        self.peak_busy: dict[str, int] = {}
        self.waiting = 0

    # -- bookkeeping readable from any thread -----------------------------------

    @property
    def records(self) -> list[RecordedRequest]:
        with self._books:
            return list(self._records)

    def record(self, entry: RecordedRequest) -> None:
        with self._books:
            self._records.append(entry)
            if entry.truncated:
                self.truncations += 1

    def stats(self) -> dict[str, Any]:
        """What ``GET /emulator/stats`` answers: proof of what the engine had to do.

        ``evictions`` counts only the models the engine pushed out on its own because a
        load did not fit; expiries, ``keep_alive: 0`` unloads and ``num_ctx`` reloads
        are not evictions. A scheduler that never overcommits a card keeps it at 0.
        """
        with self._books:
            return {
                "vramMiB": self.config.vram_mib,
                "usedVramMiB": self.used_mib(),
                "peakVramMiB": self.peak_vram_mib,
                "loads": len(self.loads), "loadsByModel": dict(Counter(self.loads)),
                "evictions": len(self.evictions),
                "evictionsByModel": dict(Counter(self.evictions)),
                "reloads": len(self.reloads),
                "truncations": self.truncations,
                "requests": len(self._records),
                "peakBusy": dict(self.peak_busy),
                "waiting": self.waiting,
            }

    def clear_records(self) -> None:
        with self._books:
            self._records.clear()

    # -- tokens and truncation --------------------------------------------------

    def tokens(self, text: str) -> int:
        return math.ceil(len(text) / self.config.chars_per_token)

    def message_tokens(self, message: Mapping[str, Any]) -> int:
        return self.tokens(_text_of(message)) + self.MESSAGE_OVERHEAD_TOKENS

    def truncate(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
        context_length: int,
    ) -> tuple[list[Mapping[str, Any]], int, int, int]:
        """Cut a prompt the way the engine does, without telling anyone.

        System messages and the newest message stay; the oldest others go first. When
        even that does not fit, the oldest tokens are cut. Returns the kept messages,
        tokens before, tokens evaluated, and how many messages were dropped.
        """
        tool_tokens = self.tokens(json.dumps(list(tools), sort_keys=True, default=str)) \
            if tools else 0
        sizes = [self.message_tokens(m) for m in messages]
        before = tool_tokens + sum(sizes)
        kept = list(range(len(messages)))
        total = before
        droppable = [i for i in kept[:-1] if messages[i].get("role") != "system"]
        dropped = 0
        while total > context_length and droppable:
            victim = droppable.pop(0)
            kept.remove(victim)
            total -= sizes[victim]
            dropped += 1
        return [messages[i] for i in kept], before, min(total, context_length), dropped

    # -- deterministic replies --------------------------------------------------

    _WORDS = ("the", "cluster", "agrees", "model", "card", "memory", "slot", "queue",
              "answer", "considered", "briefly", "capacity", "is", "enough", "so",
              "we", "proceed", "carefully", "with", "a", "plan", "that", "fits", "now")

    def reply(self, model: str, messages: Sequence[Mapping[str, Any]]) -> tuple[str, int]:
        question = next((str(m.get("content") or "") for m in reversed(messages)
                         if m.get("role") == "user"), "")
        digest = hashlib.sha256(f"{model}\n{question}".encode()).digest()
        count = 8 + digest[0] % 24
        words = [self._WORDS[digest[1 + i % 31] % len(self._WORDS)] for i in range(count)]
        return f"[{model}, emulated] " + " ".join(words) + ".", count

    def tool_calls(self, model: str, messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Calls a tool the last user message names (or what the configured rule says)."""
        if not tools:
            return []
        if self.config.tool_rule is not None:
            return self.config.tool_rule(model, messages, tools) or []
        if not messages or messages[-1].get("role") != "user":
            return []  # after a tool result the model answers in words
        asked = str(messages[-1].get("content") or "")
        for tool in tools:
            function = tool.get("function") or {}
            name = function.get("name")
            if isinstance(name, str) and name and name in asked:
                params = function.get("parameters") or {}
                props = params.get("properties") or {}
                samples = {"string": "emulated", "integer": 1, "number": 1.0,
                           "boolean": True}
                arguments = {key: samples.get(str((props.get(key) or {}).get("type")))
                             for key in params.get("required") or []}
                call_id = hashlib.sha256(f"{model}\n{asked}".encode()).hexdigest()[:8]
                return [{"id": f"call_{call_id}",
                         "function": {"index": 0, "name": name, "arguments": arguments}}]
        return []

    # -- VRAM, loads, slots -----------------------------------------------------

    def condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._cond is None or self._cond_loop is not loop:
            self._cond, self._cond_loop = asyncio.Condition(), loop
        return self._cond

    def used_mib(self) -> int:
        return sum(c.footprint_mib for c in list(self.copies.values()))

    def expire(self) -> None:
        """Drop idle copies whose keep-alive has run out (Ollama unloads them)."""
        now = self.clock.now()
        for name, copy in list(self.copies.items()):
            if copy.idle and copy.expires_at <= now:
                del self.copies[name]

    def _evict(self, copy: LoadedCopy, *, books: list[str]) -> None:
        del self.copies[copy.model.name]
        with self._books:
            books.append(copy.model.name)

    def _make_room(self, need: int) -> bool:
        """Evict idle copies, shortest remaining keep-alive first, if that suffices."""
        free = self.config.vram_mib - self.used_mib()
        if need <= free:
            return True
        idle = sorted((c for c in self.copies.values() if c.idle),
                      key=lambda c: (c.expires_at, c.model.name))
        if free + sum(c.footprint_mib for c in idle) < need:
            return False  # evicting would not help: wait for busy copies instead
        for copy in idle:
            if free >= need:
                break
            self._evict(copy, books=self.evictions)
            free += copy.footprint_mib
        return True

    async def acquire(self, model: EmulatedModel, context_length: int, *,
                      keep_alive: float, slot: bool = True) -> Slot:
        """A slot on a loaded copy of ``model`` (loading it first if needed).

        Returns the copy, whether the caller had to wait and whether it loaded the
        copy. With ``slot=False`` it only makes sure the copy is loaded (a preload) and
        takes no slot.
        """
        me = object()
        try:
            return await self._acquire(me, model, context_length,
                                       keep_alive=keep_alive, slot=slot)
        except BaseException:
            # a caller that gives up must not hold its place in line forever
            for copy in self.copies.values():
                if me in copy.line:
                    copy.line.remove(me)
            if self._cond is not None and self._cond_loop is asyncio.get_running_loop():
                async with self._cond:
                    self._cond.notify_all()
            raise

    async def _acquire(self, me: object, model: EmulatedModel, context_length: int, *,
                       keep_alive: float, slot: bool) -> Slot:
        cond = self.condition()
        waited = loaded = False
        parallel = self.config.num_parallel
        while True:
            async with cond:
                while True:
                    self.expire()
                    copy = self.copies.get(model.name)
                    if copy is not None and copy.context_length != context_length:
                        if copy.idle:  # a different num_ctx means a reload, as in Ollama
                            self._evict(copy, books=self.reloads)
                            continue
                    elif copy is None:
                        need = model.footprint_mib(context_length, parallel)
                        if need > self.config.vram_mib:
                            raise EmulatorError(
                                500, f"model {model.name} needs {need} MiB but the emulated "
                                f"GPU has {self.config.vram_mib} MiB")
                        if self._make_room(need):
                            copy = LoadedCopy(model, context_length, need,
                                              need / self.config.load_rate_mibps,
                                              expires_at=self.clock.now() + keep_alive)
                            copy.line.append(me)  # the loader is first in line
                            loaded = True
                            self.copies[model.name] = copy
                            with self._books:
                                self.loads.append(model.name)
                                self.peak_vram_mib = max(self.peak_vram_mib,
                                                         self.used_mib())
                            break
                    elif not copy.loading and not slot:
                        copy.expires_at = max(copy.expires_at, self.clock.now() + keep_alive)
                        return Slot(copy, waited, loaded)
                    elif not copy.loading:
                        if me not in copy.line:
                            if len(copy.line) >= self.config.max_queue:
                                raise EmulatorError(503, "server busy, please try again")
                            copy.line.append(me)
                        if copy.line[0] is me and copy.busy < parallel:
                            copy.line.popleft()
                            copy.busy += 1
                            with self._books:
                                self.peak_busy[model.name] = max(
                                    self.peak_busy.get(model.name, 0), copy.busy)
                            return Slot(copy, waited, loaded)
                    waited = True
                    self.waiting += 1
                    try:
                        await cond.wait()
                    finally:
                        self.waiting -= 1
            # load outside the lock so other models keep serving meanwhile
            try:
                await self.sleep(copy.load_seconds)
            finally:
                async with cond:
                    copy.loading = False
                    if not slot and me in copy.line:
                        copy.line.remove(me)
                    cond.notify_all()
            if not slot:
                return Slot(copy, waited, loaded)

    async def release(self, copy: LoadedCopy, *, keep_alive: float) -> None:
        cond = self.condition()
        async with cond:
            copy.busy -= 1
            copy.expires_at = self.clock.now() + keep_alive
            self.expire()
            cond.notify_all()

    async def unload(self, model: EmulatedModel) -> None:
        """``keep_alive: 0``: gone now if idle, else as soon as its calls finish."""
        cond = self.condition()
        async with cond:
            copy = self.copies.get(model.name)
            if copy is not None:
                copy.expires_at = self.clock.now()
                self.expire()
            cond.notify_all()

    async def sleep(self, emulated_seconds: float) -> None:
        await self.clock.sleep(emulated_seconds * self.config.time_scale)
