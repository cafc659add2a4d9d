"""Run the dashboard inside an asyncio program: the CLI, or ``kubemoot demo --dashboard``.

:class:`DashboardServer` starts a :class:`FleetView` over a store and serves the app
with uvicorn on the running event loop, so the demo's in-process store (an embedded
``MemoryKV`` cannot be shared between processes) is watched directly.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from kubemoot.clock import Clock, SystemClock
from kubemoot.dashboard.app import create_app
from kubemoot.dashboard.fleet import FleetView
from kubemoot.serving import HttpServer
from kubemoot.settings import DashboardSettings
from kubemoot.store.protocol import KV

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DashboardServer"]

DEFAULT_HOST = "127.0.0.1"  # loopback unless the user asks: the page has no login
DEFAULT_PORT = 8765
# A stop first ends every live page's stream (``stopping``), so what is left to drain is
# at most a snapshot or a metrics scrape.
_DRAIN_SECONDS = 2


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
        self._stopping = asyncio.Event()
        self._web = HttpServer(host, port, drain_seconds=_DRAIN_SECONDS)

    @property
    def url(self) -> str:
        if not self._web.bound:
            raise RuntimeError("the dashboard is not running")
        return self._web.url

    async def start(self) -> None:
        await self.view.start()
        try:
            self._web.bind()
        except OSError:
            await self.view.close()
            raise
        app = create_app(self.view, clock=self._clock, settings=self._settings,
                         stopping=self._stopping)
        await self._web.start(app)

    async def wait(self) -> None:
        """Serve until the server stops (Ctrl-C in the host program cancels this)."""
        await self._web.wait()

    async def stop(self) -> None:
        self._stopping.set()
        await self._web.stop()
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
