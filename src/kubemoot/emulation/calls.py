"""One call to the emulated engine, whichever API it came in by (no HTTP here).

The emulator's Ollama routes and its OpenAI-compatible routes turn a request body into
a :class:`GenerationCall` or an :class:`EmbeddingCall` (:func:`generation_call`,
:func:`embedding_call`); this module checks the parts both APIs share, runs the call on
:class:`~kubemoot.emulation.card.EmulatorEngine` and hands back what to answer. A
running generation holds its slot until its pieces have all been sent or it is closed,
so a client that goes away mid-stream frees the slot at once, as Ollama does.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubemoot.emulation.card import (
    EmulatedModel,
    EmulatorEngine,
    EmulatorError,
    RecordedRequest,
    Slot,
    embedding_vector,
    normalised,
    parse_keep_alive,
)
from kubemoot.emulation.prompt import Prompt

#: Ollama's answer when ``truncate: false`` meets a prompt longer than the context.
TOO_LONG = "the input length exceeds the context length"
#: The largest integer Ollama decodes into its Go ``int`` options.
MAX_INT = 2**63 - 1


# -- checks shared by both APIs ---------------------------------------------------

def check_messages(value: object) -> list[dict[str, Any]]:
    """A list of message objects whose role and content are strings (content may be
    absent), as Ollama's decoder demands; anything else is a 400."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise EmulatorError(400, "messages must be a list of objects")
    for index, message in enumerate(value):
        if not isinstance(message.get("role", ""), str):
            raise EmulatorError(400, f"messages[{index}].role must be a string")
        if not isinstance(message.get("content") or "", str):
            raise EmulatorError(400, f"messages[{index}].content must be a string")
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list)
                                      and all(isinstance(c, dict) for c in calls)):
            raise EmulatorError(400, f"messages[{index}].tool_calls must be a list of objects")
    return value


def check_tools(value: object) -> list[dict[str, Any]]:
    """Tool specs shaped as Ollama decodes them (``{"type", "function": {"name",
    "parameters": {"properties": {…}, "required": […]}}}``); anything else is a 400."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise EmulatorError(400, "tools must be a list")
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise EmulatorError(400, f"{where} must be an object")
        function = tool.get("function")
        if function is None:
            continue
        if not isinstance(function, dict):
            raise EmulatorError(400, f"{where}.function must be an object")
        if not isinstance(function.get("name", ""), str):
            raise EmulatorError(400, f"{where}.function.name must be a string")
        params = function.get("parameters")
        if params is None:
            continue
        if not isinstance(params, dict):
            raise EmulatorError(400, f"{where}.function.parameters must be an object")
        props = params.get("properties")
        if props is not None and not (isinstance(props, dict)
                                      and all(isinstance(p, dict) for p in props.values())):
            raise EmulatorError(
                400, f"{where}.function.parameters.properties must map names to objects")
        required = params.get("required")
        if required is not None and not (isinstance(required, list)
                                         and all(isinstance(r, str) for r in required)):
            raise EmulatorError(
                400, f"{where}.function.parameters.required must be a list of strings")
    return value


def check_count(value: object, field: str, *, minimum: int) -> int | None:
    """An optional integer option (``num_ctx``, ``num_predict``, ``max_tokens``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise EmulatorError(400, f"{field} must be an integer")
    if not minimum <= value <= MAX_INT:
        raise EmulatorError(400, f"{field} must be between {minimum} and {MAX_INT}")
    return value


def check_flag(value: object, field: str, *, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise EmulatorError(400, f"{field} must be true or false")
    return value


def find_model(engine: EmulatorEngine, name: object) -> EmulatedModel:
    """The catalogue entry for ``name``, or Ollama's 400/404."""
    if not isinstance(name, str) or not name:
        raise EmulatorError(400, "model is required")
    model = engine.catalogue.get(name)
    if model is None and ":" not in name:
        model = engine.catalogue.get(f"{name}:latest")  # as Ollama resolves it
    if model is None:
        raise EmulatorError(404, f'model "{name}" not found, try pulling it first')
    return model


def check_options(options: object) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise EmulatorError(400, "options must be an object")
    return options


def _num_ctx(options: object) -> int | None:
    return check_count(check_options(options).get("num_ctx"), "options.num_ctx", minimum=1)


# -- generation -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class GenerationCall:
    """A validated generation request, in the engine's terms."""

    path: str
    model: EmulatedModel
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    num_ctx: int | None
    context: int
    keep_alive: float
    truncate: bool = True  # False: an over-long prompt is a 400, never cut
    limit: int | None = None  # most tokens to generate (num_predict, max_tokens)


def generation_call(engine: EmulatorEngine, path: str, body: Mapping[str, Any], *,
                    model: EmulatedModel, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]], options: object, limit: int | None = None,
                    truncate: bool = True) -> GenerationCall:
    """The engine's view of a request; shared by the Ollama and OpenAI routes."""
    num_ctx = _num_ctx(options)
    config = engine.config
    return GenerationCall(
        path=path, model=model, messages=messages, tools=tools, num_ctx=num_ctx,
        context=num_ctx or config.context_length,
        keep_alive=parse_keep_alive(body.get("keep_alive"), config.keep_alive_s),
        truncate=truncate, limit=limit)


class Generation:
    """A generation that holds a slot: its pieces arrive paced by the emulated clock.

    Iterate :meth:`pieces` (streaming) or await :meth:`run`; either gives the slot back
    when done. :meth:`close` gives it back early and is safe to call more than once.
    """

    def __init__(self, engine: EmulatorEngine, call: GenerationCall, *,
                 slot: Slot, kept: Sequence[Mapping[str, Any]], evaluated: int) -> None:
        self._engine = engine
        self._call = call
        self.model = call.model
        self._slot = slot
        self._closed = False
        config = engine.config
        name = call.model.name
        self.tool_calls = engine.tool_calls(name, kept, call.tools)
        if self.tool_calls:
            self._pieces: list[str] = []
            self.eval_count = 8  # a tool call costs tokens too
        else:
            content, self.eval_count = engine.reply(name, kept)
            self._pieces = _split_words(content)
        self.done_reason = "stop"
        if call.limit is not None and call.limit < self.eval_count:
            self._pieces = self._pieces[:call.limit]
            self.eval_count = call.limit
            self.done_reason = "length"
        # the whole prompt evaluated, cached part included, as Ollama reports it since
        # its 0.2 line (ollama/ollama#5371); only the prefill time shows the cache
        self.prompt_eval_count = evaluated
        self.cached_tokens = slot.grant.cached_tokens if slot.grant is not None else 0
        prefill = engine.card.prefill_seconds(slot.grant) if slot.grant is not None else 0.0
        self._first_s = config.base_latency_s + prefill
        self.eval_s = config.per_token_s * self.eval_count
        self.load_s = slot.copy.load_seconds if slot.loaded else 0.0

    @property
    def content(self) -> str:
        return "".join(self._pieces)

    def durations(self) -> dict[str, int]:
        """Ollama's timing fields, in nanoseconds of emulated time."""
        total = self._first_s + self.eval_s + self.load_s
        return {"total_duration": int(total * 1e9), "load_duration": int(self.load_s * 1e9),
                "prompt_eval_count": self.prompt_eval_count,
                "prompt_eval_duration": int(self._first_s * 1e9),
                "eval_count": self.eval_count, "eval_duration": int(self.eval_s * 1e9)}

    async def pieces(self) -> AsyncIterator[str]:
        per_token = self._engine.config.per_token_s
        try:
            # the first piece comes with the prompt's evaluation; each piece's own time
            # is spent after it, so the whole call lasts first + per-token · count
            await self._engine.sleep(self._first_s)
            for piece in self._pieces:
                yield piece
                if per_token:
                    await self._engine.sleep(per_token)
            if not self._pieces and self.eval_s:
                await self._engine.sleep(self.eval_s)
        finally:
            await self.close()

    async def run(self) -> str:
        return "".join([piece async for piece in self.pieces()])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._engine.release(self._slot)


def _split_words(content: str) -> list[str]:
    """Stream pieces of the reply: the first word with its prefix, then one per word."""
    head, sep, rest = content.partition("] ")
    if not sep:
        return [content] if content else []
    words = rest.split(" ")
    return [head + sep + words[0], *(" " + word for word in words[1:])]


async def start_generation(engine: EmulatorEngine, call: GenerationCall) -> Generation:
    """Check the prompt against the context, take a slot (loading if needed), record."""
    kept, fitted = engine.truncate(call.messages, call.tools, call.context)
    got = await _admit(engine, call, _Prompt(
        messages=[dict(m) for m in call.messages], tokens=fitted.tokens_sent,
        evaluated=fitted.tokens, dropped=len(call.messages) - len(kept),
        tools=len(call.tools), refused=not call.truncate and fitted.truncated,
        engine_prompt=fitted.prompt))
    return Generation(engine, call, slot=got, kept=kept, evaluated=fitted.tokens)


# -- admission, shared by generations and embeddings -------------------------------

@dataclass(frozen=True, slots=True)
class _Prompt:
    """A call's prompt as the engine measured it, for the record of the request."""

    messages: list[dict[str, Any]]  # as received (embedding inputs as user messages)
    tokens: int  # the whole prompt as sent
    evaluated: int  # what is left after truncation
    dropped: int  # whole messages truncation left out
    tools: int
    refused: bool  # over the context with truncation off
    engine_prompt: Prompt | None = None  # what the slot evaluates (and then caches)


async def _admit(engine: EmulatorEngine, call: GenerationCall | EmbeddingCall,
                 prompt: _Prompt) -> Slot:
    """A slot for ``call`` (loading its model if needed), or Ollama's 400 for a refused
    prompt; the request is recorded once, with how its admission ended."""
    received = engine.clock.now()

    def record(queued: bool, error: str | None = None, cached: int = 0) -> None:
        refused = prompt.refused
        engine.record(RecordedRequest(
            path=call.path, model=call.model.name, messages=prompt.messages,
            num_ctx=call.num_ctx, context_length=call.context, prompt_tokens=prompt.tokens,
            prompt_tokens_evaluated=0 if refused else prompt.evaluated,
            truncated=not refused and prompt.evaluated < prompt.tokens,
            dropped_messages=0 if refused else prompt.dropped, tools=prompt.tools,
            queued=queued, received_at=received, error=error, cached_tokens=cached))

    if prompt.refused:
        record(False, TOO_LONG)
        raise EmulatorError(400, TOO_LONG)
    try:
        got = await engine.acquire(call.model, call.context, keep_alive=call.keep_alive,
                                   prompt=prompt.engine_prompt)
    except EmulatorError as error:
        record(False, error.message)
        raise
    record(got.waited, cached=got.grant.cached_tokens if got.grant is not None else 0)
    return got


# -- embeddings -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class EmbeddingCall:
    """A validated embedding request: one vector per input."""

    path: str
    model: EmulatedModel
    inputs: list[str]
    num_ctx: int | None
    context: int
    keep_alive: float
    truncate: bool = True
    dimensions: int | None = None
    normalise: bool = True  # /api/embed and /v1 normalise; legacy /api/embeddings not


def embedding_call(engine: EmulatorEngine, path: str, body: Mapping[str, Any], *,
                   model: EmulatedModel, inputs: list[str], options: object,
                   truncate: bool = True, dimensions: int | None = None,
                   normalise: bool = True) -> EmbeddingCall:
    num_ctx = _num_ctx(options)
    config = engine.config
    return EmbeddingCall(
        path=path, model=model, inputs=inputs, num_ctx=num_ctx,
        context=num_ctx or config.context_length,
        keep_alive=parse_keep_alive(body.get("keep_alive"), config.keep_alive_s),
        truncate=truncate, dimensions=dimensions, normalise=normalise)


@dataclass(frozen=True, slots=True)
class Embeddings:
    vectors: list[list[float]]
    prompt_tokens: int
    load_ns: int
    total_ns: int


async def embed(engine: EmulatorEngine, call: EmbeddingCall) -> Embeddings:
    """Deterministic vectors for ``call.inputs``; an input longer than the context is
    cut to it (or, with ``truncate`` off, refused with Ollama's 400)."""
    config = engine.config
    dims = config.embedding_length
    if call.dimensions is not None and not 1 <= call.dimensions <= dims:
        raise EmulatorError(400, f"dimensions must be between 1 and {dims}")
    if not call.inputs:  # Ollama loads the model and answers no vectors
        got = await engine.acquire(call.model, call.context, keep_alive=call.keep_alive,
                                   slot=False)
        load_ns = int(got.copy.load_seconds * 1e9) if got.loaded else 0
        return Embeddings([], 0, load_ns, load_ns)
    sizes = [engine.tokens(text) for text in call.inputs]
    too_long = [size > call.context for size in sizes]
    kept = [text[:math.floor(call.context * config.chars_per_token)] if long else text
            for text, long in zip(call.inputs, too_long, strict=True)]
    evaluated = sum(min(size, call.context) for size in sizes)
    got = await _admit(engine, call, _Prompt(
        messages=[{"role": "user", "content": text} for text in call.inputs],
        tokens=sum(sizes), evaluated=evaluated, dropped=0, tools=0,
        refused=any(too_long) and not call.truncate))
    seconds = config.embed_latency_s + config.prompt_per_token_s * evaluated
    try:
        await engine.sleep(seconds)
    finally:
        engine.release(got)
    vectors = [embedding_vector(call.model.name, text, dims)[:call.dimensions or dims]
               for text in kept]
    if call.normalise:
        vectors = [normalised(v) for v in vectors]
    load_ns = int(got.copy.load_seconds * 1e9) if got.loaded else 0
    return Embeddings(vectors, evaluated, load_ns, load_ns + int(seconds * 1e9))
