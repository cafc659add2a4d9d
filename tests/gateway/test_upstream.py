"""The gateway's pooled client to engines (gateway/upstream.py), against a real socket
server: it keeps connections for the next call, and notices one the engine closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from kubemoot.gateway.upstream import Upstream


@dataclass
class _Engine:
    """A tiny HTTP/1.1 server; ``close_after_reply`` hangs up once each reply is sent."""

    close_after_reply: bool
    connections: int = 0
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                if self.close_after_reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()
        await writer.wait_closed()
        self.hung_up.set()


@asynccontextmanager
async def _serving(engine: _Engine) -> AsyncIterator[str]:
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def test_a_kept_connection_serves_the_next_calls() -> None:
    engine = _Engine(close_after_reply=False)
    async with _serving(engine) as url:
        http = Upstream(timeout=10, connect_timeout=10, connections=4)
        try:
            for _ in range(3):
                assert await _text(http, url) == "ok"
        finally:
            await http.aclose()
    assert engine.connections == 1


async def test_a_connection_the_engine_closed_is_not_reused() -> None:
    engine = _Engine(close_after_reply=True)
    async with _serving(engine) as url:
        http = Upstream(timeout=10, connect_timeout=10, connections=4)
        try:
            assert await _text(http, url) == "ok"
            await engine.hung_up.wait()  # the idle connection in the pool is now dead
            # the second time: the pool sees the hang-up and opens a new connection
            assert await _text(http, url) == "ok"
        finally:
            await http.aclose()
    assert engine.connections == 2


async def _text(http: Upstream, url: str) -> str:
    response = await http.get(url + "/")
    try:
        return (await response.read()).decode()
    finally:
        await response.aclose()
