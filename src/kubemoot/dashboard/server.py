"""Run the dashboard inside an asyncio program: the CLI, or ``kubemoot demo --dashboard``.

:class:`DashboardServer` starts a :class:`FleetView` over a store and serves the app
with uvicorn on the running event loop, so the demo's in-process store (an embedded
``MemoryKV`` cannot be shared between processes) is watched directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from types import TracebackType

import uvicorn

from kubemoot.clock import Clock, SystemClock
from kubemoot.dashboard.app import DashboardSettings, create_app
from kubemoot.dashboard.fleet import FleetView
from kubemoot.store.protocol import KV

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DashboardServer"]

DEFAULT_HOST = "127.0.0.1"  # loopback unless the user asks: the page has no login
DEFAULT_PORT = 8765


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the host program owns Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class DashboardServer:
    """The dashboard on ``http://host:port`` for as long as the ``async with`` lasts.

    ``port=0`` picks a free port; :attr:`url` tells which. The socket is bound before
    the server starts, so a port in use fails at once with ``OSError``.
    """

    def __init__(
        self,
        kv: KV,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        clock: Clock | None = None,
        freshness_seconds: float | None = None,
        settings: DashboardSettings | None = None,
    ) -> None:
        self._clock = clock or SystemClock()
        self._settings = settings or DashboardSettings()
        self.view = FleetView(kv, clock=self._clock, freshness_seconds=freshness_seconds,
                              check_seconds=self._settings.store_check_seconds)
        self._host = host
        self._port = port
        self._stopping = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        if self._socket is None:
            raise RuntimeError("the dashboard is not running")
        host, port = self._socket.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    async def start(self) -> None:
        await self.view.start()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        # IPPROTO_TCP: asyncio turns Nagle off only for sockets that say TCP
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError:
            sock.close()
            await self.view.close()
            raise
        sock.listen(128)
        sock.setblocking(False)
        self._socket = sock
        app = create_app(self.view, clock=self._clock, settings=self._settings,
                         stopping=self._stopping)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = _QuietServer(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve([sock]))
        while not self._server.started:
            if self._task.done():
                await self._task  # surfaces the startup error
                raise RuntimeError("the dashboard server stopped during startup")
            await asyncio.sleep(0.01)

    async def wait(self) -> None:
        """Serve until the server stops (Ctrl-C in the host program cancels this)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._socket is not None:
            self._socket.close()
        await self.view.close()
        logging.getLogger(__name__).debug("dashboard stopped")

    async def __aenter__(self) -> DashboardServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
