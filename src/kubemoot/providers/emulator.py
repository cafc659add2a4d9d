"""An Ollama-API **emulator**: an HTTP server for tests and the demo. It is not Ollama.

It speaks the parts of Ollama's HTTP API that Kubemoot uses (``/api/chat``,
``/api/generate`` including preload and ``keep_alive: 0`` unload, ``/api/ps``,
``/api/tags``, ``/api/show``, ``/api/version``) over an emulated GPU: VRAM accounting
with eviction of idle models, load time from a load rate, ``num_parallel`` slots per
loaded model with a FIFO line behind them, and the engine's silent truncation of an
over-long prompt. Replies are deterministic text; no model runs.

Every generation request is recorded (:attr:`OllamaEmulator.records`) so a test can
prove what reached the engine, and faults can be injected (:meth:`OllamaEmulator.fail_next`,
:meth:`~OllamaEmulator.hostile_next`, :meth:`~OllamaEmulator.stall_next`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kubemoot.clock import Clock, SystemClock
from kubemoot.providers._emulation import (
    DEFAULT_MODELS,
    MIB,
    EmulatedModel,
    EmulatorConfig,
    EmulatorEngine,
    EmulatorError,
    LoadedCopy,
    RecordedRequest,
    parse_keep_alive,
)

__all__ = [
    "DEFAULT_MODELS",
    "EMULATOR_VERSION",
    "EmulatedModel",
    "EmulatorConfig",
    "HostileKind",
    "OllamaEmulator",
    "RecordedRequest",
]

EMULATOR_VERSION = "0.0.0-kubemoot-emulator"
HostileKind = Literal["malformed", "not-json", "wrong-shape", "hostile-values", "nested",
                      "huge", "truncated"]
_FAR_FUTURE = "2318-01-01T00:00:00Z"  # what Ollama shows for keep_alive < 0


@dataclass(slots=True)
class _Fault:
    kind: str
    path: str | None
    remaining: int
    status: int = 500
    seconds: float = 0.0


def _iso(epoch: float) -> str:
    if epoch == float("inf"):
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
    """The emulator's HTTP server, in a background thread or in the caller's loop."""

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
        self.engine = EmulatorEngine(self.config, clock=clock or SystemClock())
        self.host = host
        self.port = port
        self.log_level = log_level
        self._faults: list[_Fault] = []
        self._faults_lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._bound_port: int | None = None
        self._sock: socket.socket | None = None
        self.app = Starlette(routes=[
            Route("/", self._root, methods=["GET", "HEAD"]),
            Route("/api/version", self._version, methods=["GET", "HEAD"]),
            Route("/api/tags", self._tags, methods=["GET"]),
            Route("/api/ps", self._ps, methods=["GET"]),
            Route("/api/show", self._show, methods=["POST"]),
            Route("/api/generate", self._generate, methods=["POST"]),
            Route("/api/chat", self._chat, methods=["POST"]),
        ])

    # -- lifecycle ----------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._bound_port is None:
            raise RuntimeError("the emulator is not running")
        return f"http://{self.host}:{self._bound_port}"

    @property
    def records(self) -> list[RecordedRequest]:
        """Every generation request received, oldest first."""
        return self.engine.records

    def bind(self) -> None:
        """Take the listening socket now (``OSError`` if the port is taken); then
        :attr:`url` is known before serving starts. Port 0 picks a free port."""
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._bound_port = sock.getsockname()[1]

    def _take_socket(self) -> socket.socket:
        self.bind()
        sock, self._sock = self._sock, None
        assert sock is not None
        return sock

    def _make_server(self) -> uvicorn.Server:
        config = uvicorn.Config(self.app, log_level=self.log_level, lifespan="off",
                                access_log=False, timeout_graceful_shutdown=1)
        return uvicorn.Server(config)

    def start(self) -> OllamaEmulator:
        """Serve from a background thread; returns once it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the emulator is already running")
        sock = self._take_socket()
        server = self._server = self._make_server()
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name=f"ollama-emulator-{self._bound_port}",
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

    async def serve(self) -> None:
        """Serve in the running event loop until interrupted (the CLI's foreground mode)."""
        sock = self._take_socket()
        self._server = self._make_server()
        await self._server.serve(sockets=[sock])

    def __enter__(self) -> OllamaEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> OllamaEmulator:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

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

    async def _faulted(self, request: Request) -> Response | _RawTruncated | None:
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
        return await self._faulted(request) or JSONResponse({"version": EMULATOR_VERSION})

    def _details(self, model: EmulatedModel) -> dict[str, Any]:
        return {"format": "gguf", "family": model.family, "families": [model.family],
                "parameter_size": f"{model.size_mib} MiB", "quantization_level": "emulated"}

    async def _tags(self, request: Request) -> Any:
        if (faulted := await self._faulted(request)) is not None:
            return faulted
        return JSONResponse({"models": [
            {"name": m.name, "model": m.name, "modified_at": "2025-01-01T00:00:00Z",
             "size": m.size_mib * MIB, "digest": m.manifest_digest,
             "details": self._details(m)}
            for m in self.engine.catalogue.values()
        ]})

    def _ps_entry(self, copy: LoadedCopy) -> dict[str, Any]:
        model = copy.model
        return {"name": model.name, "model": model.name, "size": copy.footprint_mib * MIB,
                "digest": model.manifest_digest, "details": self._details(model),
                "expires_at": _iso(copy.expires_at), "size_vram": copy.footprint_mib * MIB,
                "context_length": copy.context_length}

    async def _ps(self, request: Request) -> Any:
        if (faulted := await self._faulted(request)) is not None:
            return faulted
        self.engine.expire()
        return JSONResponse({"models": [self._ps_entry(c)
                                        for c in self.engine.copies.values()]})

    async def _body(self, request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise EmulatorError(400, "invalid JSON body") from None
        if not isinstance(body, dict):
            raise EmulatorError(400, "the body must be a JSON object")
        return body

    def _model(self, body: Mapping[str, Any]) -> EmulatedModel:
        name = body.get("model") or body.get("name")
        if not isinstance(name, str) or not name:
            raise EmulatorError(400, "model is required")
        model = self.engine.catalogue.get(name)
        if model is None:
            raise EmulatorError(404, f'model "{name}" not found, try pulling it first')
        return model

    async def _show(self, request: Request) -> Any:
        if (faulted := await self._faulted(request)) is not None:
            return faulted
        try:
            model = self._model(await self._body(request))
        except EmulatorError as error:
            return JSONResponse({"error": error.message}, status_code=error.status)
        return JSONResponse({
            "modelfile": f"# emulated model {model.name}", "parameters": "", "template": "",
            "details": self._details(model), "capabilities": ["completion", "tools"],
            "model_info": {"general.architecture": "kubemoot-emulator",
                           "emulator.size_mib": model.size_mib,
                           "emulator.context_length": self.config.context_length},
        })

    async def _generate(self, request: Request) -> Any:
        return await self._serve_generation(request, chat=False)

    async def _chat(self, request: Request) -> Any:
        return await self._serve_generation(request, chat=True)

    async def _serve_generation(self, request: Request, *, chat: bool) -> Any:
        if (faulted := await self._faulted(request)) is not None:
            return faulted
        try:
            body = await self._body(request)
            payload = await self._generation(request.url.path, body, chat=chat)
        except EmulatorError as error:
            return JSONResponse({"error": error.message}, status_code=error.status)
        if body.get("stream", True) is False:
            return JSONResponse(payload)
        # a stream of one final chunk is a valid stream; clients that stream accept it
        return Response(json.dumps(payload) + "\n", media_type="application/x-ndjson")

    async def _generation(self, path: str, body: Mapping[str, Any], *,
                          chat: bool) -> dict[str, Any]:
        engine = self.engine
        model = self._model(body)
        options = body.get("options") or {}
        if not isinstance(options, dict):
            raise EmulatorError(400, "options must be an object")
        num_ctx = options.get("num_ctx")
        if num_ctx is not None and (not isinstance(num_ctx, int) or num_ctx <= 0):
            raise EmulatorError(400, "options.num_ctx must be a positive integer")
        context = num_ctx or self.config.context_length
        keep_alive = parse_keep_alive(body.get("keep_alive"), self.config.keep_alive_s)
        messages = self._messages(body, chat=chat)
        created = _iso(engine.clock.now())
        if not messages:  # no prompt: a preload, or with keep_alive 0 an unload
            if keep_alive == 0:
                await engine.unload(model)
                return self._done(model, chat, created, "", "unload")
            got = await engine.acquire(model, context, keep_alive=keep_alive, slot=False)
            load_ns = int(got.copy.load_seconds * 1e9) if got.loaded else 0
            return self._done(model, chat, created, "", "load", load_duration=load_ns)
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise EmulatorError(400, "tools must be a list")
        kept, before, evaluated, dropped = engine.truncate(messages, tools, context)
        received = engine.clock.now()

        def record(queued: bool, error: str | None = None) -> None:
            engine.record(RecordedRequest(
                path=path, model=model.name, messages=[dict(m) for m in messages],
                num_ctx=num_ctx, context_length=context, prompt_tokens=before,
                prompt_tokens_evaluated=evaluated, truncated=evaluated < before,
                dropped_messages=dropped, tools=len(tools), queued=queued,
                received_at=received, error=error))

        try:
            got = await engine.acquire(model, context, keep_alive=keep_alive)
        except EmulatorError as error:
            record(False, error.message)
            raise
        copy = got.copy
        record(got.waited)
        try:
            content, eval_count = engine.reply(model.name, kept)
            calls = engine.tool_calls(model.name, kept, tools)
            if calls:
                content, eval_count = "", 8
            seconds = (self.config.base_latency_s + self.config.per_token_s * eval_count
                       + self.config.prompt_per_token_s * evaluated)
            await engine.sleep(seconds)
        finally:
            await engine.release(copy, keep_alive=keep_alive)
        load_ns = int(copy.load_seconds * 1e9) if got.loaded else 0
        extra = {"prompt_eval_count": evaluated, "eval_count": eval_count,
                 "total_duration": int(seconds * 1e9) + load_ns, "load_duration": load_ns,
                 "eval_duration": int(seconds * 1e9)}
        payload = self._done(model, chat, created, content, "stop", **extra)
        if chat and calls:
            payload["message"]["tool_calls"] = calls
        return payload

    def _messages(self, body: Mapping[str, Any], *, chat: bool) -> list[dict[str, Any]]:
        if chat:
            messages = body.get("messages") or []
            if not isinstance(messages, list) or not all(isinstance(m, dict)
                                                          for m in messages):
                raise EmulatorError(400, "messages must be a list of objects")
            return messages
        prompt = body.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise EmulatorError(400, "prompt must be a string")
        if not prompt:
            return []
        system = body.get("system")
        head = [{"role": "system", "content": system}] if isinstance(system, str) else []
        return [*head, {"role": "user", "content": prompt}]

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
