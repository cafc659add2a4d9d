"""The gateway's pooled client to engines (gateway/upstream.py), against a real socket
server: it keeps connections for the next call, notices one the engine closed, passes
streamed lines through as they were sent, tells a cut answer from a whole one, and
waits for a free connection past its limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from kubemoot.gateway.upstream import ConnectFailed, ConnectionBroken, Upstream, UpstreamTimeout


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


# -- scripted engines: each connection answers from a list of raw replies -------------


@dataclass
class _Scripted:
    """Answers the n-th request on any connection with ``replies[n]`` (raw bytes, sent in
    the pieces given); ``hang_up`` closes after that reply, ``hold`` keeps the connection
    open without answering until ``release`` is set."""

    replies: list[list[bytes]]
    hang_up: bool = False
    hold: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    received: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                self.received.set()
                if self.hold:
                    await self.release.wait()
                for piece in self.replies[len(self.requests) - 1]:
                    writer.write(piece)
                    await writer.drain()
                if self.hang_up:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()
        self.closed.set()


def _chunked(*pieces: bytes) -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n" \
           b"Transfer-Encoding: chunked\r\n\r\n"
    return [head, *(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces), b"0\r\n\r\n"]


async def test_streamed_lines_pass_through_whole_and_byte_for_byte() -> None:
    # lines split across chunks, two in one chunk, spaces kept as the engine wrote them
    engine = _Scripted([_chunked(b'{"a": 1}\n{"b"', b': 2}\n', b'\n{"c":3}\n{"d": "\xc3\xa9"}\n')])
    async with _serving(engine) as url:
        http = Upstream(timeout=10, connect_timeout=10, connections=4)
        try:
            response = await http.post(url + "/api/chat", b'{"model":"m"}')
            assert response.status == 200
            lines = [line async for line in response.lines()]
            await response.aclose()
        finally:
            await http.aclose()
    assert lines == [b'{"a": 1}\n', b'{"b": 2}\n', b'{"c":3}\n', b'{"d": "\xc3\xa9"}\n']
    request = engine.requests[0]
    assert request.startswith(b"POST /api/chat HTTP/1.1\r\n")
    assert b"Content-Length: 13\r\n" in request and request.endswith(b'{"model":"m"}')


async def test_an_answer_cut_midway_is_an_error_not_an_end() -> None:
    engine = _Scripted([_chunked(b'{"a": 1}\n')[:2]], hang_up=True)  # no last chunk
    async with _serving(engine) as url:
        http = Upstream(timeout=10, connect_timeout=10, connections=4)
        try:
            response = await http.post(url + "/api/chat", b"{}")
            seen = []
            with pytest.raises(ConnectionBroken):
                async for line in response.lines():
                    seen.append(line)
            assert seen == [b'{"a": 1}\n']
        finally:
            await http.aclose()


async def test_an_answer_without_length_ends_with_its_connection() -> None:
    engine = _Scripted([[b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"all ", b"of it"]],
                       hang_up=True)
    async with _serving(engine) as url:
        http = Upstream(timeout=10, connect_timeout=10, connections=4)
        try:
            response = await http.get(url + "/")
            assert await response.read() == b"all of it"
        finally:
            await http.aclose()


async def test_giving_up_on_an_answer_cuts_its_connection_and_the_next_call_opens_one() -> None:
    first = _chunked(b'{"a": 1}\n')[:2]  # the engine is still "generating"
    engine = _Scripted([first, [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]])
    async with _serving(engine) as url:
        http = Upstream(timeout=10, connect_timeout=10, connections=4)
        try:
            response = await http.post(url + "/api/chat", b"{}")
            await response.aclose()  # the client went away: the engine must learn it
            await engine.closed.wait()
            second = await http.get(url + "/")
            assert await second.read() == b"ok"
            assert http.open_connections == 1
        finally:
            await http.aclose()
    assert engine.connections == 2


async def test_past_the_connection_limit_a_call_waits_for_a_free_one() -> None:
    ok = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
    engine = _Scripted([ok, ok], hold=True)
    async with _serving(engine) as url:
        http = Upstream(timeout=10, connect_timeout=10, connections=1)
        try:
            first = asyncio.ensure_future(http.get(url + "/"))
            await engine.received.wait()  # the only connection carries the first call
            second = asyncio.ensure_future(http.get(url + "/"))  # no connection is free
            engine.release.set()
            assert await (await first).read() == b"ok"
            assert await (await second).read() == b"ok"  # on the connection the first freed
        finally:
            await http.aclose()
    assert engine.connections == 1


async def test_no_free_connection_in_time_is_a_timeout() -> None:
    engine = _Scripted([[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]], hold=True)
    async with _serving(engine) as url:
        http = Upstream(timeout=0.2, connect_timeout=10, connections=1)
        try:
            held = asyncio.ensure_future(http.get(url + "/", timeout=10))
            await engine.received.wait()  # the only connection carries the first call
            with pytest.raises(UpstreamTimeout, match="no free connection"):
                await http.get(url + "/")
            engine.release.set()
            assert await (await held).read() == b"ok"
        finally:
            await http.aclose()


async def test_a_refused_connection_says_no_byte_left() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    http = Upstream(timeout=10, connect_timeout=10, connections=1)
    try:
        with pytest.raises(ConnectFailed):
            await http.post(f"http://127.0.0.1:{port}/api/chat", b"{}")
        assert http.open_connections == 0  # the failed attempt holds no place
    finally:
        await http.aclose()
