"""An Ollama-API **emulator**: an HTTP server for tests and the demo. It is not Ollama.

It speaks the parts of Ollama's HTTP API that Kubemoot and common clients use
(``/api/chat`` and ``/api/generate`` streamed as NDJSON or whole, with preload,
``keep_alive: 0`` unload and ``truncate: false``; ``/api/embed``, ``/api/embeddings``,
``/api/ps``, ``/api/tags``, ``/api/show``, ``/api/version``) and the OpenAI-compatible
subset Ollama serves under ``/v1`` (see :mod:`kubemoot.providers._emulator_openai`),
over an emulated GPU: the engine model the simulator runs too
(:mod:`kubemoot.providers.engine`: memory less a reserve, one line per card, loads one
at a time, unloads that take time, ``num_parallel`` slots per copy, keep-alive in
emulated seconds), and the engine's silent truncation of an over-long prompt. Replies
and embeddings are deterministic; no model runs.

Every request that reaches the engine is recorded (:attr:`OllamaEmulator.records`),
``GET /emulator/stats`` (and :meth:`OllamaEmulator.stats`) tells loads, evictions the
engine forced, truncations and peak VRAM, so a test can prove what reached the engine;
faults can be injected (:meth:`OllamaEmulator.fail_next`,
:meth:`~OllamaEmulator.hostile_next`, :meth:`~OllamaEmulator.stall_next`).
Malformed bodies are answered 400 with ``{"error": …}``, as Ollama's decoder does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kubemoot.clock import Clock
from kubemoot.providers._emulated_calls import (
    EmbeddingCall,
    Generation,
    GenerationCall,
    check_count,
    check_flag,
    check_messages,
    check_tools,
    embed,
    start_generation,
)
from kubemoot.providers._emulation import (
    DEFAULT_MODELS,
    MIB,
    EmulatedModel,
    EmulatorConfig,
    EmulatorEngine,
    EmulatorError,
    RecordedRequest,
    parse_keep_alive,
)
from kubemoot.providers._emulator_openai import openai_routes
from kubemoot.providers._emulator_stream import run_unless_abandoned
from kubemoot.providers.engine import EngineCopy
from kubemoot.serving import StreamWithCleanup, bind_socket, server_config, socket_url

__all__ = [
    "DEFAULT_MODELS",
    "EMULATOR_VERSION",
    "EmulatedModel",
    "EmulatorConfig",
    "HostileKind",
    "OllamaEmulator",
    "RecordedRequest",
]

#: The Ollama API level it speaks (clients compare versions), marked as an emulator.
EMULATOR_VERSION = "0.12.0-kubemoot-emulator"
HostileKind = Literal["malformed", "not-json", "wrong-shape", "hostile-values", "nested",
                      "huge", "truncated"]
_FAR_FUTURE = "2318-01-01T00:00:00Z"  # what Ollama shows for keep_alive < 0
_MODIFIED_AT = "2025-01-01T00:00:00Z"


@dataclass(slots=True)
class _Fault:
    kind: str
    path: str | None
    remaining: int
    status: int = 500
    seconds: float = 0.0


def _iso(epoch: float) -> str:
    if not math.isfinite(epoch):  # keep_alive < 0: never expires
        return _FAR_FUTURE
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


class _RawTruncated:
    """An ASGI response that promises more body than it sends, then ends."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"4096")]})
        # returning mid-body makes the server drop the connection, which is exactly
        # what a client sees when an engine dies mid-answer
        await send({"type": "http.response.body", "body": b'{"models": [{"na',
                    "more_body": True})


def _hostile_response(kind: str) -> Response | _RawTruncated:
    if kind == "malformed":
        return Response(b'{"models": [{"name": "qwen3:8b", "size_vram": 12',
                        media_type="application/json")
    if kind == "not-json":
        return Response(b"<html><body>502 Bad Gateway</body></html>",
                        media_type="application/json")
    if kind == "wrong-shape":
        return JSONResponse({"models": "all of them", "message": 42})
    if kind == "hostile-values":
        return JSONResponse({"models": [{"name": "\x1b[31mx\x1b[0m" * 50,
                                         "size_vram": -(2**60), "context_length": "lots",
                                         "expires_at": "yesterday"}],
                             "message": {"role": "assistant", "content": None}})
    if kind == "nested":
        return Response(b"[" * 200_000 + b"]" * 200_000, media_type="application/json")
    if kind == "huge":
        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"models": [], "pad": "'
            for _ in range(64):  # 64 MiB, far past any sane answer
                yield b"x" * MIB
            yield b'"}'
        return StreamingResponse(chunks(), media_type="application/json")
    if kind == "truncated":
        return _RawTruncated()
    raise ValueError(f"unknown hostile kind {kind!r}")


class OllamaEmulator:
    """The emulator's HTTP server, in a background thread or in the caller's loop.

    ``clock`` is the engine's clock, in emulated seconds; by default wall time scaled by
    ``config.time_scale`` (:class:`~kubemoot.clock.ScaledClock`).
    """

    def __init__(
        self,
        config: EmulatorConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
        log_level: str = "error",
    ) -> None:
        self.config = config if config is not None else EmulatorConfig()
        self.engine = EmulatorEngine(self.config, clock=clock)
        self.host = host
        self.port = port
        self.log_level = log_level
        self._faults: list[_Fault] = []
        self._faults_lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._url: str | None = None
        self._sock: socket.socket | None = None
        faulty = self.with_faults
        self.app = Starlette(routes=[
            Route("/", self._root, methods=["GET", "HEAD"]),
            Route("/api/version", faulty(self._version), methods=["GET", "HEAD"]),
            Route("/api/tags", faulty(self._tags), methods=["GET"]),
            Route("/api/ps", faulty(self._ps), methods=["GET"]),
            Route("/api/show", faulty(self._show), methods=["POST"]),
            Route("/api/generate", faulty(self._generate), methods=["POST"]),
            Route("/api/chat", faulty(self._chat), methods=["POST"]),
            Route("/api/embed", faulty(self._embed), methods=["POST"]),
            Route("/api/embeddings", faulty(self._embeddings), methods=["POST"]),
            *openai_routes(self),
            Route("/emulator/stats", self._stats, methods=["GET"]),
        ])

    # -- lifecycle ----------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the emulator is not running")
        return self._url

    @property
    def records(self) -> list[RecordedRequest]:
        """Every generation request received, oldest first."""
        return self.engine.records

    async def until(self, predicate: Callable[[EmulatorEngine], bool], *,
                    timeout: float = 30.0) -> None:
        """Return once ``predicate(engine)`` holds, woken by the engine's changes (a
        test's event to wait on; ``timeout`` real seconds only guards a hung test)."""
        await asyncio.to_thread(self.engine.wait_until, predicate, timeout)

    def bind(self) -> None:
        """Take the listening socket now (``OSError`` if the port is taken); then
        :attr:`url` is known before serving starts. Port 0 picks a free port."""
        if self._sock is not None:
            return
        sock = bind_socket(self.host, self.port)
        self._sock = sock
        self._url = socket_url(sock)

    def _take_socket(self) -> socket.socket:
        self.bind()
        sock, self._sock = self._sock, None
        assert sock is not None
        return sock

    def _make_server(self) -> uvicorn.Server:
        # a plain uvicorn.Server, signal handlers included: run in a thread, uvicorn
        # cannot install them and leaves the process's signals to its host
        return uvicorn.Server(server_config(self.app, drain_seconds=1,
                                            log_level=self.log_level))

    def start(self) -> OllamaEmulator:
        """Serve from a background thread; returns once it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the emulator is already running")
        sock = self._take_socket()
        server = self._server = self._make_server()
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name=f"ollama-emulator-{sock.getsockname()[1]}",
                                        daemon=True)
        self._thread.start()
        started = threading.Event()
        while not server.started and self._thread.is_alive():
            started.wait(0.01)
        if not server.started:
            raise RuntimeError("the emulator failed to start")
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread to end."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> OllamaEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> OllamaEmulator:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    def stamp(self, emulated: float | None = None) -> str:
        """:meth:`EmulatorEngine.wall_time` as the ISO time Ollama's answers carry."""
        return _iso(self.engine.wall_time(emulated))

    # -- fault injection ----------------------------------------------------------

    def _inject(self, fault: _Fault) -> None:
        with self._faults_lock:
            self._faults.append(fault)

    def fail_next(self, status: int = 500, *, count: int = 1, path: str | None = None) -> None:
        """The next ``count`` requests (to ``path``, or any) answer HTTP ``status``."""
        self._inject(_Fault("status", path, count, status=status))

    def hostile_next(self, kind: HostileKind, *, count: int = 1,
                     path: str | None = None) -> None:
        """The next ``count`` requests get a malformed, truncated or hostile body."""
        _hostile_response(kind)  # reject unknown kinds now, not mid-request
        self._inject(_Fault(kind, path, count))

    def stall_next(self, seconds: float, *, count: int = 1, path: str | None = None) -> None:
        """The next ``count`` requests wait ``seconds`` (real) before being served."""
        self._inject(_Fault("stall", path, count, seconds=seconds))

    def clear_faults(self) -> None:
        with self._faults_lock:
            self._faults.clear()

    def _take_fault(self, path: str) -> _Fault | None:
        with self._faults_lock:
            for fault in self._faults:
                if fault.path is None or fault.path == path:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def with_faults(self, endpoint: Callable[[Request], Awaitable[Any]],
                    ) -> Callable[[Request], Awaitable[Any]]:
        """``endpoint`` behind fault injection: a pending fault answers in its place (a
        stall first waits, then lets the endpoint answer)."""
        @functools.wraps(endpoint)
        async def answer(request: Request) -> Any:
            if (faulted := await self._injected_fault(request)) is not None:
                return faulted
            return await endpoint(request)
        return answer

    async def _injected_fault(self, request: Request) -> Response | _RawTruncated | None:
        """The injected fault's answer for this request, if one is pending."""
        fault = self._take_fault(request.url.path)
        if fault is None:
            return None
        if fault.kind == "stall":
            await asyncio.sleep(fault.seconds)  # real time: it exists to trip timeouts
            return None
        if fault.kind == "status":
            return JSONResponse({"error": f"injected failure (HTTP {fault.status})"},
                                status_code=fault.status)
        return _hostile_response(fault.kind)

    # -- endpoints ----------------------------------------------------------------

    async def _root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama-API emulator (kubemoot) is running; not Ollama")

    async def _version(self, request: Request) -> Any:
        return JSONResponse({"version": EMULATOR_VERSION})

    def _details(self, model: EmulatedModel) -> dict[str, Any]:
        return {"format": "gguf", "family": model.family, "families": [model.family],
                "parameter_size": f"{model.size_mib} MiB", "quantization_level": "emulated"}

    async def _tags(self, request: Request) -> Any:
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
                "expires_at": self.stamp(expires), "size_vram": copy.footprint_mib * MIB,
                "context_length": copy.context_length}

    async def _ps(self, request: Request) -> Any:
        return JSONResponse({"models": [self._ps_entry(m, c)
                                        for m, c in self.engine.copies()]})

    async def read_body(self, request: Request) -> dict[str, Any]:
        """The request's JSON object, or a 400 (never a traceback) for anything else."""
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise EmulatorError(400, "invalid JSON body") from None
        except RecursionError:  # Go's decoder stops at a depth limit too, with a 400
            raise EmulatorError(400, "invalid JSON body: nested too deeply") from None
        if not isinstance(body, dict):
            raise EmulatorError(400, "the body must be a JSON object")
        return body

    def _model(self, body: Mapping[str, Any]) -> EmulatedModel:
        return self.find_model(body.get("model") or body.get("name"))

    def find_model(self, name: object) -> EmulatedModel:
        """The catalogue entry for ``name``, or Ollama's 400/404."""
        if not isinstance(name, str) or not name:
            raise EmulatorError(400, "model is required")
        model = self.engine.catalogue.get(name)
        if model is None and ":" not in name:
            model = self.engine.catalogue.get(f"{name}:latest")  # as Ollama resolves it
        if model is None:
            raise EmulatorError(404, f'model "{name}" not found, try pulling it first')
        return model

    async def _show(self, request: Request) -> Any:
        try:
            model = self._model(await self.read_body(request))
        except EmulatorError as error:
            return _error(error)
        family = model.family
        return JSONResponse({
            "modelfile": f"# emulated model {model.name}", "parameters": "", "template": "",
            "details": self._details(model), "capabilities": ["completion", "tools"],
            "modified_at": _MODIFIED_AT, "license": "emulated, no weights",
            "model_info": {"general.architecture": family,
                           "general.parameter_count": model.size_mib * 1_000_000,
                           f"{family}.context_length": self.config.context_length,
                           f"{family}.embedding_length": self.config.embedding_length,
                           "emulator.size_mib": model.size_mib,
                           "emulator.context_length": self.config.context_length},
        })

    async def _stats(self, request: Request) -> Any:
        return JSONResponse(self.engine.stats())

    def stats(self) -> dict[str, Any]:
        """Loads, engine-initiated evictions, truncations and peak VRAM so far."""
        return self.engine.stats()

    # -- generation and embeddings --------------------------------------------------

    def generation_call(self, path: str, body: Mapping[str, Any], *, model: EmulatedModel,
                        messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                        options: object, limit: int | None = None,
                        truncate: bool = True) -> GenerationCall:
        """The engine's view of a request; shared by the Ollama and OpenAI routes."""
        num_ctx = self._num_ctx(options)
        return GenerationCall(
            path=path, model=model, messages=messages, tools=tools, num_ctx=num_ctx,
            context=num_ctx or self.config.context_length,
            keep_alive=parse_keep_alive(body.get("keep_alive"), self.config.keep_alive_s),
            truncate=truncate, limit=limit)

    @staticmethod
    def _options(options: object) -> dict[str, Any]:
        if options is None:
            return {}
        if not isinstance(options, dict):
            raise EmulatorError(400, "options must be an object")
        return options

    def _num_ctx(self, options: object) -> int | None:
        return check_count(self._options(options).get("num_ctx"), "options.num_ctx",
                           minimum=1)

    async def _generate(self, request: Request) -> Any:
        return await self._serve_generation(request, chat=False)

    async def _chat(self, request: Request) -> Any:
        return await self._serve_generation(request, chat=True)

    async def _serve_generation(self, request: Request, *, chat: bool) -> Any:
        try:
            body = await self.read_body(request)
            model = self._model(body)
            options = self._options(body.get("options"))
            predict = check_count(options.get("num_predict"), "options.num_predict",
                                  minimum=-2)
            call = self.generation_call(
                request.url.path, body, model=model, messages=self._messages(body, chat=chat),
                tools=check_tools(body.get("tools")) if chat else [], options=options,
                limit=predict if predict is not None and predict > 0 else None,
                truncate=check_flag(body.get("truncate"), "truncate", default=True))
            stream = body.get("stream", True) is not False
            if not call.messages:  # no prompt: a preload, or with keep_alive 0 an unload
                return await self._preload(call, chat=chat, stream=stream)
            generation = await start_generation(self.engine, call)
        except EmulatorError as error:
            return _error(error)
        created = self.stamp()
        if not stream:
            if await run_unless_abandoned(request, generation) is None:
                return Response(status_code=499)  # nobody is listening any more
            return JSONResponse(self._final(generation, chat, created, with_content=True))
        return StreamWithCleanup(self._ndjson(generation, chat), cleanup=generation.close,
                                 media_type="application/x-ndjson")

    async def _preload(self, call: GenerationCall, *, chat: bool, stream: bool) -> Response:
        engine, model = self.engine, call.model
        created = self.stamp()
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
            chunk = self._part(model, chat, self.stamp(), piece)
            yield json.dumps(chunk).encode() + b"\n"
        created = self.stamp()
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
        # fill-in-the-middle: the engine's template puts the suffix in the prompt too
        suffix = body.get("suffix")
        tail = [{"role": "suffix", "content": suffix}] if isinstance(suffix, str) else []
        return [*head, {"role": "user", "content": prompt}, *tail]

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

    async def _embed(self, request: Request) -> Any:
        """``/api/embed``: ``input`` is a string or a list of them; unit vectors."""
        try:
            body = await self.read_body(request)
            model = self._model(body)
            result = await embed(self.engine, self.embedding_call(
                request.url.path, body, model=model, inputs=_inputs(body.get("input")),
                options=body.get("options"),
                truncate=check_flag(body.get("truncate"), "truncate", default=True),
                dimensions=check_count(body.get("dimensions"), "dimensions", minimum=1)))
        except EmulatorError as error:
            return _error(error)
        return JSONResponse({"model": model.name, "embeddings": result.vectors,
                             "total_duration": result.total_ns,
                             "load_duration": result.load_ns,
                             "prompt_eval_count": result.prompt_tokens})

    async def _embeddings(self, request: Request) -> Any:
        """``/api/embeddings`` (the older call): one ``prompt``, one raw vector."""
        try:
            body = await self.read_body(request)
            prompt = body.get("prompt")
            if prompt is not None and not isinstance(prompt, str):
                raise EmulatorError(400, "prompt must be a string")
            result = await embed(self.engine, self.embedding_call(
                request.url.path, body, model=self._model(body),
                inputs=[prompt] if prompt else [], options=body.get("options"),
                normalise=False))
        except EmulatorError as error:
            return _error(error)
        return JSONResponse({"embedding": result.vectors[0] if result.vectors else []})

    def embedding_call(self, path: str, body: Mapping[str, Any], *, model: EmulatedModel,
                       inputs: list[str], options: object, truncate: bool = True,
                       dimensions: int | None = None, normalise: bool = True,
                       ) -> EmbeddingCall:
        num_ctx = self._num_ctx(options)
        return EmbeddingCall(
            path=path, model=model, inputs=inputs, num_ctx=num_ctx,
            context=num_ctx or self.config.context_length,
            keep_alive=parse_keep_alive(body.get("keep_alive"), self.config.keep_alive_s),
            truncate=truncate, dimensions=dimensions, normalise=normalise)


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
