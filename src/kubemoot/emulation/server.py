"""An Ollama-API **emulator**: an HTTP server for tests and the demo. It is not Ollama.

It speaks the parts of Ollama's HTTP API that Kubemoot and common clients use
(``/api/chat`` and ``/api/generate`` streamed as NDJSON or whole, with preload,
``keep_alive: 0`` unload and ``truncate: false``; ``/api/embed``, ``/api/embeddings``,
``/api/ps``, ``/api/tags``, ``/api/show``, ``/api/version``) and the OpenAI-compatible
subset Ollama serves under ``/v1``, over an emulated GPU: the engine model the
simulator runs too (:mod:`kubemoot.emulation.engine`: memory less a reserve, one line
per card, loads one at a time, unloads that take time, ``num_parallel`` slots per copy,
keep-alive in emulated seconds, a footprint that grows with the context, the silent
cut of an over-long prompt). Replies and embeddings are deterministic; no model runs.

Every request that reaches the engine is recorded (:attr:`OllamaEmulator.records`),
``GET /emulator/stats`` (and :meth:`OllamaEmulator.stats`) tells loads, evictions the
engine forced, truncations and peak VRAM, so a test can prove what reached the engine;
faults can be injected (:meth:`OllamaEmulator.fail_next`,
:meth:`~OllamaEmulator.hostile_next`, :meth:`~OllamaEmulator.stall_next`).
Malformed bodies are answered 400 with ``{"error": …}``, as Ollama's decoder does.

All routes, Ollama's and OpenAI's, are in one table (:func:`routes`); the handlers live
in :mod:`~kubemoot.emulation.ollama_routes` and :mod:`~kubemoot.emulation.openai_routes`
and import nothing from here.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route

from kubemoot.clock import Clock
from kubemoot.emulation.card import (
    DEFAULT_MODELS,
    EmulatedModel,
    EmulatorConfig,
    EmulatorEngine,
    RecordedRequest,
    catalogue,
    parse_model_option,
)
from kubemoot.emulation.faults import Faults, HostileKind
from kubemoot.emulation.ollama_routes import EMULATOR_VERSION, OllamaRoutes
from kubemoot.emulation.openai_routes import OpenAIRoutes
from kubemoot.serving import bind_socket, server_config, socket_url

__all__ = [
    "DEFAULT_MODELS",
    "EMULATOR_VERSION",
    "EmulatedModel",
    "EmulatorConfig",
    "HostileKind",
    "OllamaEmulator",
    "RecordedRequest",
    "catalogue",
    "parse_model_option",
    "routes",
]


def routes(engine: EmulatorEngine, faults: Faults) -> list[Route]:
    """The emulator's one route table: every path it answers, the Ollama and the
    OpenAI-compatible ones, each engine route behind the armed faults."""
    api, v1, faulty = OllamaRoutes(engine), OpenAIRoutes(engine), faults.wrap
    return [
        Route("/", api.root, methods=["GET", "HEAD"]),
        Route("/api/version", faulty(api.version), methods=["GET", "HEAD"]),
        Route("/api/tags", faulty(api.tags), methods=["GET"]),
        Route("/api/ps", faulty(api.ps), methods=["GET"]),
        Route("/api/show", faulty(api.show), methods=["POST"]),
        Route("/api/generate", faulty(api.generate), methods=["POST"]),
        Route("/api/chat", faulty(api.chat), methods=["POST"]),
        Route("/api/embed", faulty(api.embed), methods=["POST"]),
        Route("/api/embeddings", faulty(api.embeddings), methods=["POST"]),
        Route("/v1/models", faulty(v1.models), methods=["GET"]),
        Route("/v1/models/{model:path}", v1.model, methods=["GET"]),
        Route("/v1/chat/completions", faulty(v1.chat), methods=["POST"]),
        Route("/v1/embeddings", faulty(v1.embeddings), methods=["POST"]),
        Route("/emulator/stats", api.stats, methods=["GET"]),
    ]


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
        self.faults = Faults()
        self.host = host
        self.port = port
        self.log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._url: str | None = None
        self._sock: socket.socket | None = None
        self.app = Starlette(routes=routes(self.engine, self.faults))

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

    def stats(self) -> dict[str, Any]:
        """Loads, engine-initiated evictions, truncations and peak VRAM so far."""
        return self.engine.stats()

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
        """:meth:`EmulatorEngine.stamp`: an engine instant as Ollama's ISO time."""
        return self.engine.stamp(emulated)

    # -- fault hooks (see kubemoot.emulation.faults) -----------------------------

    def fail_next(self, status: int = 500, *, count: int = 1, path: str | None = None) -> None:
        """The next ``count`` requests (to ``path``, or any) answer HTTP ``status``."""
        self.faults.fail_next(status, count=count, path=path)

    def hostile_next(self, kind: HostileKind, *, count: int = 1,
                     path: str | None = None) -> None:
        """The next ``count`` requests get a malformed, truncated or hostile body."""
        self.faults.hostile_next(kind, count=count, path=path)

    def stall_next(self, seconds: float, *, count: int = 1, path: str | None = None) -> None:
        """The next ``count`` requests wait ``seconds`` (real) before being served."""
        self.faults.stall_next(seconds, count=count, path=path)

    def clear_faults(self) -> None:
        self.faults.clear()
