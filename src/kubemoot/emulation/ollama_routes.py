"""The emulator's Ollama-API handlers (``/api/*``), over one emulated card.

Each handler turns a request into the engine's terms (:mod:`kubemoot.emulation.calls`),
runs it on :class:`~kubemoot.emulation.card.EmulatorEngine` and answers in Ollama's
shapes: NDJSON or whole answers, ``{"error": …}`` for what Ollama refuses. The server's
one route table (:mod:`kubemoot.emulation.server`) names these handlers beside the
OpenAI-compatible ones.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from kubemoot.emulation.calls import (
    Generation,
    GenerationCall,
    check_count,
    check_flag,
    check_messages,
    check_options,
    check_tools,
    embed,
    embedding_call,
    find_model,
    generation_call,
    start_generation,
)
from kubemoot.emulation.card import MIB, EmulatedModel, EmulatorEngine, EmulatorError
from kubemoot.emulation.engine import EngineCopy
from kubemoot.emulation.stream import read_body, run_unless_abandoned
from kubemoot.serving import StreamWithCleanup

__all__ = ["EMULATOR_VERSION", "OllamaRoutes"]

#: The Ollama API level it speaks (clients compare versions), marked as an emulator.
EMULATOR_VERSION = "0.12.0-kubemoot-emulator"
_MODIFIED_AT = "2025-01-01T00:00:00Z"


class OllamaRoutes:
    """The ``/api`` handlers (and the emulator's own root and stats pages)."""

    def __init__(self, engine: EmulatorEngine) -> None:
        self.engine = engine

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama-API emulator (kubemoot) is running; not Ollama")

    async def version(self, request: Request) -> Any:
        return JSONResponse({"version": EMULATOR_VERSION})

    def _details(self, model: EmulatedModel) -> dict[str, Any]:
        return {"format": "gguf", "family": model.family, "families": [model.family],
                "parameter_size": f"{model.size_mib} MiB", "quantization_level": "emulated"}

    async def tags(self, request: Request) -> Any:
        return JSONResponse({"models": [
            {"name": m.name, "model": m.name, "modified_at": _MODIFIED_AT,
             "size": m.size_mib * MIB, "digest": m.manifest_digest,
             "details": self._details(m)}
            for m in self.engine.catalogue.values()
        ]})

    def _ps_entry(self, model: EmulatedModel, copy: EngineCopy) -> dict[str, Any]:
        # a copy in use has no expiry yet; it shows when it would expire if idle now
        expires = copy.expires_at if copy.refs == 0 \
            else self.engine.clock.now() + copy.keep_alive
        return {"name": model.name, "model": model.name, "size": copy.footprint_mib * MIB,
                "digest": model.manifest_digest, "details": self._details(model),
                "expires_at": self.engine.stamp(expires), "size_vram": copy.footprint_mib * MIB,
                "context_length": copy.context_length}

    async def ps(self, request: Request) -> Any:
        return JSONResponse({"models": [self._ps_entry(m, c)
                                        for m, c in self.engine.copies()]})

    def _model(self, body: Mapping[str, Any]) -> EmulatedModel:
        return find_model(self.engine, body.get("model") or body.get("name"))

    async def show(self, request: Request) -> Any:
        try:
            model = self._model(await read_body(request))
        except EmulatorError as error:
            return _error(error)
        family = model.family
        return JSONResponse({
            "modelfile": f"# emulated model {model.name}", "parameters": "", "template": "",
            "details": self._details(model), "capabilities": ["completion", "tools"],
            "modified_at": _MODIFIED_AT, "license": "emulated, no weights",
            "model_info": {"general.architecture": family,
                           "general.parameter_count": model.size_mib * 1_000_000,
                           f"{family}.context_length": self.engine.config.context_length,
                           f"{family}.embedding_length": self.engine.config.embedding_length,
                           "emulator.size_mib": model.size_mib,
                           "emulator.context_length": self.engine.config.context_length},
        })

    async def stats(self, request: Request) -> Any:
        return JSONResponse(self.engine.stats())

    # -- generation and embeddings --------------------------------------------------

    async def generate(self, request: Request) -> Any:
        return await self._serve_generation(request, chat=False)

    async def chat(self, request: Request) -> Any:
        return await self._serve_generation(request, chat=True)

    async def _serve_generation(self, request: Request, *, chat: bool) -> Any:
        try:
            body = await read_body(request)
            model = self._model(body)
            options = check_options(body.get("options"))
            predict = check_count(options.get("num_predict"), "options.num_predict",
                                  minimum=-2)
            call = generation_call(
                self.engine, request.url.path, body, model=model,
                messages=self._messages(body, chat=chat),
                tools=check_tools(body.get("tools")) if chat else [], options=options,
                limit=predict if predict is not None and predict > 0 else None,
                truncate=check_flag(body.get("truncate"), "truncate", default=True))
            stream = body.get("stream", True) is not False
            if not call.messages:  # no prompt: a preload, or with keep_alive 0 an unload
                return await self._preload(call, chat=chat, stream=stream)
            generation = await start_generation(self.engine, call)
        except EmulatorError as error:
            return _error(error)
        created = self.engine.stamp()
        if not stream:
            if await run_unless_abandoned(request, generation) is None:
                return Response(status_code=499)  # nobody is listening any more
            return JSONResponse(self._final(generation, chat, created, with_content=True))
        return StreamWithCleanup(self._ndjson(generation, chat), cleanup=generation.close,
                                 media_type="application/x-ndjson")

    async def _preload(self, call: GenerationCall, *, chat: bool, stream: bool) -> Response:
        engine, model = self.engine, call.model
        created = self.engine.stamp()
        if call.keep_alive == 0:
            engine.unload(model)
            payload = self._done(model, chat, created, "", "unload")
        else:
            got = await engine.acquire(model, call.context, keep_alive=call.keep_alive,
                                       slot=False)
            load_ns = int(got.copy.load_seconds * 1e9) if got.loaded else 0
            payload = self._done(model, chat, created, "", "load", load_duration=load_ns)
        if not stream:
            return JSONResponse(payload)
        return Response(json.dumps(payload) + "\n", media_type="application/x-ndjson")

    async def _ndjson(self, generation: Generation, chat: bool) -> AsyncIterator[bytes]:
        model = generation.model
        async for piece in generation.pieces():
            chunk = self._part(model, chat, self.engine.stamp(), piece)
            yield json.dumps(chunk).encode() + b"\n"
        created = self.engine.stamp()
        if chat and generation.tool_calls:  # Ollama sends the calls before the final chunk
            chunk = self._part(model, chat, created, "")
            chunk["message"]["tool_calls"] = generation.tool_calls
            yield json.dumps(chunk).encode() + b"\n"
        final = self._final(generation, chat, created, with_content=False)
        yield json.dumps(final).encode() + b"\n"

    def _final(self, generation: Generation, chat: bool, created: str, *,
               with_content: bool) -> dict[str, Any]:
        content = generation.content if with_content else ""
        payload = self._done(generation.model, chat, created, content,
                             generation.done_reason, **generation.durations())
        if chat and with_content and generation.tool_calls:
            payload["message"]["tool_calls"] = generation.tool_calls
        return payload

    def _messages(self, body: Mapping[str, Any], *, chat: bool) -> list[dict[str, Any]]:
        if chat:
            return check_messages(body.get("messages"))
        prompt = body.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise EmulatorError(400, "prompt must be a string")
        if not prompt:
            return []
        system = body.get("system")
        head = [{"role": "system", "content": system}] if isinstance(system, str) else []
        return [*head, {"role": "user", "content": prompt}]

    @staticmethod
    def _part(model: EmulatedModel, chat: bool, created: str, piece: str) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": model.name, "created_at": created}
        if chat:
            payload["message"] = {"role": "assistant", "content": piece}
        else:
            payload["response"] = piece
        payload["done"] = False
        return payload

    @staticmethod
    def _done(model: EmulatedModel, chat: bool, created: str, content: str, reason: str,
              **extra: Any) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": model.name, "created_at": created}
        if chat:
            payload["message"] = {"role": "assistant", "content": content}
        else:
            payload["response"] = content
        payload.update(done=True, done_reason=reason, **extra)
        return payload

    async def embed(self, request: Request) -> Any:
        """``/api/embed``: ``input`` is a string or a list of them; unit vectors."""
        try:
            body = await read_body(request)
            model = self._model(body)
            result = await embed(self.engine, embedding_call(
                self.engine, request.url.path, body, model=model, inputs=_inputs(body.get("input")),
                options=body.get("options"),
                truncate=check_flag(body.get("truncate"), "truncate", default=True),
                dimensions=check_count(body.get("dimensions"), "dimensions", minimum=1)))
        except EmulatorError as error:
            return _error(error)
        return JSONResponse({"model": model.name, "embeddings": result.vectors,
                             "total_duration": result.total_ns,
                             "load_duration": result.load_ns,
                             "prompt_eval_count": result.prompt_tokens})

    async def embeddings(self, request: Request) -> Any:
        """``/api/embeddings`` (the older call): one ``prompt``, one raw vector."""
        try:
            body = await read_body(request)
            prompt = body.get("prompt")
            if prompt is not None and not isinstance(prompt, str):
                raise EmulatorError(400, "prompt must be a string")
            result = await embed(self.engine, embedding_call(
                self.engine, request.url.path, body, model=self._model(body),
                inputs=[prompt] if prompt else [], options=body.get("options"),
                normalise=False))
        except EmulatorError as error:
            return _error(error)
        return JSONResponse({"embedding": result.vectors[0] if result.vectors else []})

def _inputs(value: object) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise EmulatorError(400, "input must be a string or a list of strings")


def _error(error: EmulatorError) -> JSONResponse:
    return JSONResponse({"error": error.message}, status_code=error.status)


