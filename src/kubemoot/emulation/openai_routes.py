"""The emulator's OpenAI-compatible handlers, the subset Ollama serves under ``/v1``.

``/v1/chat/completions`` (plain or server-sent events, with
``stream_options.include_usage``), ``/v1/models`` and ``/v1/embeddings``. They run on
the same engine as the Ollama routes (same slots, VRAM and records); only the shapes
differ. Like Ollama's compatibility layer they offer no ``truncate`` switch: an
over-long prompt is cut silently here too. Errors use OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
import itertools
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kubemoot.emulation.calls import (
    Generation,
    check_count,
    check_messages,
    check_tools,
    embed,
    embedding_call,
    find_model,
    generation_call,
    start_generation,
)
from kubemoot.emulation.card import EmulatorEngine, EmulatorError
from kubemoot.emulation.stream import read_body, run_unless_abandoned
from kubemoot.serving import StreamWithCleanup

__all__ = ["OpenAIRoutes"]

_FINGERPRINT = "fp_kubemoot_emulator"
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def _error(error: EmulatorError) -> JSONResponse:
    kind = _ERROR_TYPES.get(error.status, "api_error")
    return JSONResponse({"error": {"message": error.message, "type": kind, "param": None,
                                   "code": None}}, status_code=error.status)


def _text(content: object, where: str) -> str | None:
    """OpenAI message content (a string, null, or a list of parts) as plain text."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise EmulatorError(400, f"{where} parts must be objects")
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise EmulatorError(400, f"{where} text parts need a string text")
                texts.append(part["text"])
        return "".join(texts)
    raise EmulatorError(400, f"{where} must be a string or a list of parts")


def _messages(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise EmulatorError(400, "messages must be a non-empty list")
    if not all(isinstance(m, dict) for m in value):
        raise EmulatorError(400, "messages must be a list of objects")
    converted = [{**m, "content": _text(m.get("content"), f"messages[{i}].content")}
                 for i, m in enumerate(value)]
    return check_messages(converted)


class OpenAIRoutes:
    """The ``/v1`` handlers over one emulated card (the server's route table names them)."""

    def __init__(self, engine: EmulatorEngine) -> None:
        self.engine = engine
        self._ids = itertools.count(1)

    def _created(self) -> int:
        return int(self.engine.wall_time())

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            self._entry(name) for name in self.engine.catalogue]})

    async def model(self, request: Request) -> Response:
        try:
            name = find_model(self.engine, request.path_params["model"]).name
        except EmulatorError as error:
            return _error(error)
        return JSONResponse(self._entry(name))

    @staticmethod
    def _entry(name: str) -> dict[str, Any]:
        owner = name.split("/", 1)[0] if "/" in name else "library"
        return {"id": name, "object": "model", "created": 1735689600, "owned_by": owner}

    async def chat(self, request: Request) -> Response:
        engine = self.engine
        try:
            body = await read_body(request)
            model = find_model(engine, body.get("model"))
            limit = check_count(body.get("max_completion_tokens", body.get("max_tokens")),
                                "max_tokens", minimum=1)
            stream_options = body.get("stream_options") or {}
            if not isinstance(stream_options, dict):
                raise EmulatorError(400, "stream_options must be an object")
            call = generation_call(
                engine, request.url.path, body, model=model,
                messages=_messages(body.get("messages")),
                tools=check_tools(body.get("tools")), options=None, limit=limit)
            generation = await start_generation(engine, call)
        except EmulatorError as error:
            return _error(error)
        ident = f"chatcmpl-{next(self._ids)}"
        if body.get("stream") is not True:
            content = await run_unless_abandoned(request, generation)
            if content is None:
                return Response(status_code=499)  # nobody is listening any more
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if generation.tool_calls:
                message["tool_calls"] = _tool_calls(generation)
            return JSONResponse({
                "id": ident, "object": "chat.completion", "created": self._created(),
                "model": model.name, "system_fingerprint": _FINGERPRINT,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": _finish(generation)}],
                "usage": _usage(generation)})
        events = self._events(ident, generation, bool(stream_options.get("include_usage")))
        return StreamWithCleanup(events, cleanup=generation.close,
                                 media_type="text/event-stream")

    async def _events(self, ident: str, generation: Generation,
                      include_usage: bool) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            return _sse({"id": ident, "object": "chat.completion.chunk",
                         "created": self._created(), "model": generation.model.name,
                         "system_fingerprint": _FINGERPRINT,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        async for piece in generation.pieces():
            yield chunk({"role": "assistant", "content": piece}, None)
        if generation.tool_calls:
            yield chunk({"role": "assistant", "content": "",
                         "tool_calls": _tool_calls(generation)}, None)
        yield chunk({"role": "assistant", "content": ""}, _finish(generation))
        if include_usage:
            yield _sse({"id": ident, "object": "chat.completion.chunk",
                        "created": self._created(), "model": generation.model.name,
                        "system_fingerprint": _FINGERPRINT, "choices": [],
                        "usage": _usage(generation)})
        yield b"data: [DONE]\n\n"

    async def embeddings(self, request: Request) -> Response:
        engine = self.engine
        try:
            body = await read_body(request)
            model = find_model(engine, body.get("model"))
            raw = body.get("input")
            inputs = [raw] if isinstance(raw, str) else raw
            if not isinstance(inputs, list) or not inputs or not all(
                    isinstance(text, str) for text in inputs):
                raise EmulatorError(400, "input must be a non-empty string or list of "
                                         "strings (token arrays are not supported)")
            encoding = body.get("encoding_format") or "float"
            if encoding not in ("float", "base64"):
                raise EmulatorError(400, "encoding_format must be float or base64")
            result = await embed(engine, embedding_call(
                engine, request.url.path, body, model=model, inputs=inputs, options=None,
                dimensions=check_count(body.get("dimensions"), "dimensions", minimum=1)))
        except EmulatorError as error:
            return _error(error)
        data = [{"object": "embedding", "index": index,
                 "embedding": _base64(vector) if encoding == "base64" else vector}
                for index, vector in enumerate(result.vectors)]
        return JSONResponse({"object": "list", "data": data, "model": model.name,
                             "usage": {"prompt_tokens": result.prompt_tokens,
                                       "total_tokens": result.prompt_tokens}})


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _finish(generation: Generation) -> str:
    return "tool_calls" if generation.tool_calls else generation.done_reason


def _usage(generation: Generation) -> dict[str, int]:
    prompt, completion = generation.prompt_eval_count, generation.eval_count
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _tool_calls(generation: Generation) -> list[dict[str, Any]]:
    """Ollama's tool calls in OpenAI's shape: arguments as a JSON string."""
    return [{"id": call.get("id") or f"call_{index}", "index": index, "type": "function",
             "function": {"name": call["function"]["name"],
                          "arguments": json.dumps(call["function"].get("arguments") or {})}}
            for index, call in enumerate(generation.tool_calls)]


def _base64(vector: list[float]) -> str:
    """Little-endian float32, base64: what the ``openai`` client asks for by default."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
