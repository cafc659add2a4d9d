"""Whole-call deadlines and the no-silent-retry rule, against real loopback servers.

A per-read HTTP timeout does not bound a call: a server that sends one byte just
before each read would time out keeps the call alive for as long as it likes. These
servers drip their answers or never answer, over real HTTP, so what is tested is what
the adapter does on the wire.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kubemoot.clock import ManualClock
from kubemoot.providers.factory import ProviderClients
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober
from kubemoot.providers.protocol import (
    ProviderDeadlineExceeded,
    ProviderTimeout,
    ProviderUnavailable,
)
from kubemoot.settings import Settings
from tests.providers.conftest import serve_app

KUBEMOOT = str(Path(sys.executable).with_name("kubemoot"))
#: One byte every this many seconds: well inside any per-read timeout used below.
DRIP_SECONDS = 0.05
#: Padding bytes in a dripped answer: 600 × 0.05 s = 30 s for the whole body.
DRIP_BYTES = 600


class _Servers:
    """Loopback servers that misbehave slowly; ``stop`` ends every pending answer."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.arrived = threading.Event()
        self.chats = 0

    async def _drip(self, request: Request) -> Response:
        body = b'{"models": []' + b" " * DRIP_BYTES + b"}"
        stop = self.stop

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(len(body)):
                if stop.is_set():
                    return
                yield body[i:i + 1]
                await asyncio.sleep(DRIP_SECONDS)  # the fault itself: a slow server

        return StreamingResponse(chunks(), media_type="application/json")

    async def _silent_chat(self, request: Request) -> Response:
        self.chats += 1
        self.arrived.set()
        await asyncio.to_thread(self.stop.wait)  # answers only when the test is over
        return JSONResponse({"error": "too late"}, status_code=500)

    @contextmanager
    def _serving(self, app: Starlette) -> Iterator[str]:
        with serve_app(app) as url:
            try:
                yield url
            finally:
                self.stop.set()  # pending answers end, so the server can shut down

    def dripping(self) -> AbstractContextManager[str]:
        """A server whose /api/ps and /api/tags drip a valid answer for 30 s."""
        return self._serving(Starlette(routes=[Route("/api/ps", self._drip),
                                               Route("/api/tags", self._drip)]))

    def silent(self) -> AbstractContextManager[str]:
        """A server whose /api/chat counts each request and never answers it."""
        return self._serving(Starlette(routes=[Route("/api/chat", self._silent_chat,
                                                     methods=["POST"])]))


@pytest.fixture
def servers() -> Iterator[_Servers]:
    made = _Servers()
    yield made
    made.stop.set()


async def test_a_dripping_probe_ends_at_its_deadline_and_is_not_ready(
    servers: _Servers,
) -> None:
    with servers.dripping() as url:
        client = OllamaProvider("drip", url, timeout=2.0, deadline=0.5, max_retries=0)
        try:
            with pytest.raises(ProviderDeadlineExceeded, match=r"0\.5 s deadline"):
                await client.probe()
            [state] = await Prober([client], clock=ManualClock(10.0)).probe_all()
        finally:
            await client.close()
    assert state.ready is False
    assert state.reason is not None and "deadline" in state.reason


async def test_a_deadline_is_a_timeout_and_names_the_provider(servers: _Servers) -> None:
    with servers.dripping() as url:
        async with OllamaProvider("drip", url, timeout=2.0, deadline=0.3) as client:
            with pytest.raises(ProviderTimeout) as caught:
                await client.probe()
    error = caught.value
    assert isinstance(error, ProviderDeadlineExceeded)
    assert error.provider == "drip" and error.endpoint == url
    assert error.provider_fault


def test_probe_timeout_bounds_the_whole_probe(servers: _Servers) -> None:
    """``probe --timeout 1`` against a dripping server: not ready, and no 30 s wait."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("KUBEMOOT_DEBUG", None)
    with servers.dripping() as url:
        done = subprocess.run([KUBEMOOT, "probe", f"drip={url}", "--timeout", "1",
                               "-o", "json"], capture_output=True, text=True, timeout=60,
                              env=env)
    assert done.returncode == 0, done.stderr
    [state] = json.loads(done.stdout)
    assert state["ready"] is False
    assert "deadline" in state["reason"]  # the deadline ended it, not the 60 s guard


async def test_a_timed_out_chat_reaches_the_engine_once(servers: _Servers) -> None:
    with servers.silent() as url:
        # the default retry budget: a refused connection may be retried, a timeout not
        async with OllamaProvider("gpu", url, timeout=0.3, retry_delay=0) as client:
            with pytest.raises(ProviderTimeout):
                await client.chat("m", [{"role": "user", "content": "hi"}])
            # a starved server thread may count the request only now
            assert await asyncio.to_thread(servers.arrived.wait, 30)
    assert servers.chats == 1


async def test_a_refused_connection_is_retried_once_and_says_nothing_was_sent(
    closed_port: int,
) -> None:
    async with OllamaProvider("gpu", f"http://127.0.0.1:{closed_port}", timeout=1.0,
                              retry_delay=0) as client:
        with pytest.raises(ProviderUnavailable, match="refused") as caught:
            await client.chat("m", [{"role": "user", "content": "hi"}])
    assert caught.value.sent is False
    assert caught.value.provider_fault


def test_the_deployment_s_deadline_applies_where_none_is_given() -> None:
    # docs/runtime.md lists KUBEMOOT_PROVIDER_CALL_DEADLINE_SECONDS; every client a
    # process makes (gateway, agent, demo, chat pools) comes from the factory its entry
    # point built from what it read, so each honours it.
    read = Settings.from_env({"KUBEMOOT_PROVIDER_CALL_DEADLINE_SECONDS": "42"})
    factory = ProviderClients.of(read.runtime)
    assert factory.client("p", "http://127.0.0.1:1").deadline == 42.0
    assert factory.client("p", "http://127.0.0.1:1", deadline=5.0).deadline == 5.0
