"""The emulator's side of the engine (no HTTP here).

Memory, the card's line, loads, unloads, slots and keep-alive are the shared engine
model, :class:`kubemoot.emulation.engine.OllamaEngine`, which the simulator runs too.
Around it this module keeps what only the emulator needs: the catalogue and each
model's footprint for a context, the deterministic tokenizer and the silent cut of an
over-long prompt, deterministic replies and embeddings, and the books a test reads
(every request, loads, evictions, truncations). Durations are emulated seconds on the
engine's clock; ``time_scale`` sets how many real seconds one of them costs.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from kubemoot.clock import Clock, ScaledClock
from kubemoot.emulation.engine import (
    OLLAMA_KEEP_ALIVE_SECONDS,
    CardSpec,
    EngineCopy,
    EngineEvents,
    ModelExceedsCard,
    ModelSize,
    OllamaEngine,
    QueueFull,
    SlotGrant,
    UnloadReason,
)
from kubemoot.emulation.prompt import FittedPrompt, Prompt, PromptBlock
from kubemoot.providers.durations import DurationError, duration_seconds
from kubemoot.settings import DEFAULTS

MIB = 1024 * 1024
_FAR_FUTURE = "2318-01-01T00:00:00Z"  # what Ollama shows for keep_alive < 0

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

    @property
    def size(self) -> ModelSize:
        """The model's size in the engine's terms (weights and KV slab per token)."""
        return ModelSize(self.size_mib, self.kv_mib_per_1k_tokens)

    def footprint_mib(self, context_length: int, num_parallel: int) -> int:
        return self.size.footprint_mib(context_length, num_parallel)

    @property
    def manifest_digest(self) -> str:
        return self.digest or hashlib.sha256(self.name.encode()).hexdigest()


DEFAULT_MODELS: tuple[EmulatedModel, ...] = (
    EmulatedModel("qwen3:8b", 5120, kv_mib_per_1k_tokens=36.0, family="qwen3"),
    EmulatedModel("qwen3:14b", 9216, kv_mib_per_1k_tokens=40.0, family="qwen3"),
    EmulatedModel("qwen3:32b", 20480, kv_mib_per_1k_tokens=64.0, family="qwen3"),
)


@dataclass(slots=True)
class EmulatorConfig:
    """Everything the emulated engine does is decided by these numbers."""

    models: Sequence[EmulatedModel] = DEFAULT_MODELS
    vram_mib: int = 24576
    # what the card keeps back, as the runtime assumes by default: the engine offers
    # vram_mib − reserve_mib
    reserve_mib: int = DEFAULTS.reserve_mib
    num_parallel: int = 1
    context_length: int = 4096
    load_rate_mibps: float = DEFAULTS.load_rate_mibps  # what the runtime assumes, too
    unload_seconds: float = DEFAULTS.unload_seconds  # memory stays held meanwhile
    base_latency_s: float = 0.5  # per generation, before tokens
    per_token_s: float = 0.02  # per generated token
    # per prompt token a slot's cache does not hold (the engine's prefill)
    prompt_per_token_s: float = DEFAULTS.prefill_seconds_per_token
    time_scale: float = 1.0  # real seconds per emulated second (0.01 makes tests fast)
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
    #: of the evaluated prompt, what the slot's cache held (only the rest was prefilled)
    cached_tokens: int = 0


class Slot(NamedTuple):
    """What :meth:`EmulatorEngine.acquire` got for its caller."""

    copy: EngineCopy
    waited: bool  # waited for a slot, a load by someone else, or memory
    loaded: bool  # this caller loaded the copy (and paid the load time)
    grant: SlotGrant | None = None  # the slot and its cache (None: a preload, no slot)


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


def _key(kind: str, text: str) -> str:
    return hashlib.sha256(f"{kind}\n{text}".encode()).hexdigest()[:16]


def _text_of(message: Mapping[str, Any]) -> str:
    parts = [str(message.get("content") or "")]
    if message.get("tool_calls"):
        parts.append(json.dumps(message["tool_calls"], sort_keys=True, default=str))
    return "".join(parts)


class _Books(EngineEvents):
    """The engine's loads and unloads, as the emulator's stats count them."""

    def __init__(self, lock: AbstractContextManager[object]) -> None:
        self._lock = lock
        self.loads: list[str] = []
        self.evictions: list[str] = []  # pushed out by the engine because memory ran short
        self.reloads: list[str] = []  # unloaded to load again with another num_ctx
        #: (emulated time, "load" or the unload reason, model), oldest first: the story
        #: a failing test prints when the engine did something it should not have
        self.history: list[tuple[float, str, str]] = []

    def load_started(self, model: str, mib: int, at: float) -> None:
        with self._lock:
            self.loads.append(model)
            self.history.append((at, "load", model))

    def unloaded(self, model: str, reason: UnloadReason, at: float) -> None:
        books = {UnloadReason.EVICTED: self.evictions, UnloadReason.RELOAD: self.reloads}
        with self._lock:
            self.history.append((at, str(reason), model))
            if reason in books:
                books[reason].append(model)


class EmulatorEngine:
    """The shared engine model on one card, with the emulator's books around it:
    footprints, truncation, deterministic replies, records and stats."""

    MESSAGE_OVERHEAD_TOKENS = 4  # role markers and template per message

    def __init__(self, config: EmulatorConfig, *, clock: Clock | None = None) -> None:
        """``clock`` counts emulated seconds; by default wall time scaled by
        ``config.time_scale``."""
        self.config = config
        self.clock = clock if clock is not None else ScaledClock(config.time_scale)
        self.catalogue = {m.name: m for m in config.models}
        # records and counters are read from other threads; re-entrant so that a
        # predicate of wait_until may read them
        self._books = threading.RLock()
        # notified on every change a test may wait for, from the server's thread
        self._changed = threading.Condition(self._books)
        self._engine_books = _Books(self._books)
        self.card = OllamaEngine("emulator", CardSpec(
            vram_mib=config.vram_mib, reserve_mib=config.reserve_mib,
            num_parallel=config.num_parallel, load_rate_mibps=config.load_rate_mibps,
            unload_seconds=config.unload_seconds, keep_alive_seconds=config.keep_alive_s,
            max_queue=config.max_queue, prefill_seconds_per_token=config.prompt_per_token_s),
            clock=self.clock, events=self._engine_books)
        self.card.on_change(self._tell)
        self._records: list[RecordedRequest] = []
        self.truncations = 0  # requests whose prompt the engine cut
        self.peak_busy: dict[str, int] = {}

    @property
    def loads(self) -> list[str]:
        with self._books:
            return list(self._engine_books.loads)

    @property
    def evictions(self) -> list[str]:
        """Models the engine pushed out because a load did not fit."""
        with self._books:
            return list(self._engine_books.evictions)

    @property
    def reloads(self) -> list[str]:
        with self._books:
            return list(self._engine_books.reloads)

    def story(self) -> str:
        """Loads, unloads (with their reason) and requests in the order they happened,
        one per line: what a failing test prints to show how the card got where it is."""
        with self._books:
            lines = [(at, f"{what} {model}") for at, what, model in self._engine_books.history]
            lines += [(r.received_at, f"request {r.path} {r.model}"
                       + (" (queued)" if r.queued else "") + (f" error {r.error}" if r.error
                                                               else ""))
                      for r in self._records]
        start = min((at for at, _ in lines), default=0.0)
        return "\n".join(f"{at - start:9.3f} {text}" for at, text in sorted(lines,
                                                                          key=lambda x: x[0]))

    # -- bookkeeping readable from any thread -----------------------------------

    def _tell(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait_until(self, predicate: Callable[[EmulatorEngine], bool], timeout: float) -> None:
        """Block (another thread than the server's) until ``predicate(self)`` holds; it
        is checked again after each change of the card (a request joining or leaving
        its line, a slot taken or given back, a copy loaded or gone) and each record.
        ``TimeoutError`` after ``timeout`` real seconds, a guard against a hung test."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self), timeout):
                raise TimeoutError(f"the emulator's state did not change as awaited "
                                   f"within {timeout:g} s")

    @property
    def records(self) -> list[RecordedRequest]:
        with self._books:
            return list(self._records)

    def record(self, entry: RecordedRequest) -> None:
        with self._books:
            self._records.append(entry)
            if entry.truncated:
                self.truncations += 1
            self._changed.notify_all()

    def stats(self) -> dict[str, Any]:
        """What ``GET /emulator/stats`` answers: proof of what the engine had to do.

        ``evictions`` counts only the models the engine pushed out on its own because a
        load did not fit; expiries, ``keep_alive: 0`` unloads and ``num_ctx`` reloads
        are not evictions. A scheduler that never overcommits a card keeps it at 0.
        """
        card = self.card
        with self._books:
            books = self._engine_books
            return {
                "vramMiB": self.config.vram_mib,
                "reserveMiB": self.config.reserve_mib,
                "usedVramMiB": card.used_mib,
                "peakVramMiB": card.peak_mib,
                "loads": len(books.loads), "loadsByModel": dict(Counter(books.loads)),
                "evictions": len(books.evictions),
                "evictionsByModel": dict(Counter(books.evictions)),
                "reloads": len(books.reloads),
                "truncations": self.truncations,
                "cachedPromptTokens": sum(r.cached_tokens for r in self._records),
                "requests": len(self._records),
                "peakBusy": dict(self.peak_busy),
                "waiting": card.waiting(),
            }

    def clear_records(self) -> None:
        with self._books:
            self._records.clear()

    # -- tokens and truncation --------------------------------------------------

    def tokens(self, text: str) -> int:
        return math.ceil(len(text) / self.config.chars_per_token)

    def message_tokens(self, message: Mapping[str, Any]) -> int:
        return self.tokens(_text_of(message)) + self.MESSAGE_OVERHEAD_TOKENS

    def prompt(self, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]]) -> Prompt:
        """The request's prompt in the engine's terms: the tool definitions (pinned),
        then one block per message, each keyed by its text, counted by the emulator's
        tokenizer."""
        blocks = []
        if tools:
            text = json.dumps(list(tools), sort_keys=True, default=str)
            blocks.append(PromptBlock(_key("tools", text), self.tokens(text), pinned=True))
        for message in messages:
            role = str(message.get("role") or "")
            blocks.append(PromptBlock(_key(role, _text_of(message)),
                                      self.message_tokens(message), pinned=role == "system"))
        return Prompt(tuple(blocks))

    def truncate(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
        context_length: int, *, counted: bool = True,
    ) -> tuple[list[Mapping[str, Any]], FittedPrompt]:
        """Cut a prompt the way the engine does (:meth:`~kubemoot.emulation.prompt.
        Prompt.fit`), counted by the emulator's tokenizer. Returns the kept messages and
        the prompt as the engine evaluates it. A cut is counted in the engine's
        ``truncations`` unless ``counted`` is off (a request that refuses to be cut)."""
        prompt = self.prompt(messages, tools)
        fitted = (self.card.fit(prompt, context_length) if counted
                  else prompt.fit(context_length))
        offset = 1 if tools else 0  # the tools' block comes first
        kept = [messages[i - offset] for i in fitted.kept if i >= offset]
        return kept, fitted

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

    # -- the card: loads, slots, keep-alive --------------------------------------

    def wall_time(self, emulated: float | None = None) -> float:
        """An instant of the engine's clock (now by default) as the Unix time clients
        are shown, in wall-clock terms however fast emulated time runs."""
        if emulated is None:
            emulated = self.clock.now()
        if isinstance(self.clock, ScaledClock):
            return self.clock.wall_time(emulated)
        return emulated

    def stamp(self, emulated: float | None = None) -> str:
        """:meth:`wall_time` as the ISO time Ollama's answers carry."""
        epoch = self.wall_time(emulated)
        if not math.isfinite(epoch):  # keep_alive < 0: never expires
            return _FAR_FUTURE
        return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")

    def footprint_mib(self, model: EmulatedModel, context_length: int) -> int:
        return model.footprint_mib(context_length, self.config.num_parallel)

    def copies(self) -> list[tuple[EmulatedModel, EngineCopy]]:
        """The copies ``/api/ps`` lists: loading or ready, not on their way out."""
        return [(self.catalogue[c.model], c) for c in list(self.card.copies.values())
                if c.state != "unloading"]

    async def acquire(self, model: EmulatedModel, context_length: int, *,
                      keep_alive: float, slot: bool = True,
                      prompt: Prompt | None = None) -> Slot:
        """A slot on a ready copy of ``model`` (loading it first if needed), with
        ``prompt`` left in its cache.

        With ``slot=False`` it only makes sure the copy is loaded (a preload) and takes
        no slot. The caller gives a slot back with :meth:`release`.
        """
        need = self.footprint_mib(model, context_length)
        try:
            got = await self.card.acquire(model.name, model.size,
                                          context_length=context_length,
                                          keep_alive=keep_alive)
        except ModelExceedsCard:
            raise EmulatorError(
                500, f"model {model.name} needs {need} MiB but the emulated GPU offers "
                f"{self.card.usable_mib} MiB ({self.config.vram_mib} MiB less a "
                f"{self.config.reserve_mib} MiB reserve)") from None
        except QueueFull:
            raise EmulatorError(503, "server busy, please try again") from None
        copy = got.copy
        if not slot:
            self.card.release(copy)
            return Slot(copy, got.waited, got.loaded)
        try:
            grant = await self.card.take_slot(copy, prompt)
        except BaseException:
            self.card.release(copy)
            raise
        with self._changed:
            self.peak_busy[model.name] = max(self.peak_busy.get(model.name, 0), copy.active)
            self._changed.notify_all()
        return Slot(copy, got.waited or grant.waited, got.loaded, grant)

    def release(self, slot: Slot) -> None:
        """Give back the slot :meth:`acquire` took; idle, the copy's keep-alive starts."""
        if slot.grant is not None:
            self.card.give_slot(slot.copy, slot.grant)
        self.card.release(slot.copy)

    def unload(self, model: EmulatedModel) -> None:
        """``keep_alive: 0``: gone now if idle, else as soon as its calls finish."""
        self.card.unload(model.name)

    async def sleep(self, emulated_seconds: float) -> None:
        await self.clock.sleep(emulated_seconds)


def parse_model_option(text: str) -> EmulatedModel:
    """``NAME=MiB`` (CLI ``--model``) → a catalogue entry; ``ValueError`` when malformed."""
    name, sep, size = text.rpartition("=")
    if not sep or not name:
        raise ValueError(f"expected NAME=MiB, got {text!r}")
    mib = int(size)
    if mib <= 0:
        raise ValueError(f"the size of {name} must be a positive number of MiB")
    return EmulatedModel(name=name, size_mib=mib)


def catalogue(models: Sequence[EmulatedModel]) -> tuple[EmulatedModel, ...]:
    """A catalogue with unique names (the last definition of a name wins)."""
    return tuple({m.name: m for m in models}.values())
