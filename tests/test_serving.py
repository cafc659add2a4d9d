"""One way to serve HTTP (kubemoot.serving), against a real uvicorn and a real client."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kubemoot.serving import (
    HttpServer,
    StreamWithCleanup,
    bind_socket,
    server_config,
    socket_url,
)


def _app(*, cleaned: asyncio.Event, hold: asyncio.Event) -> Starlette:
    async def hello(request: Request) -> Response:
        return PlainTextResponse("hello")

    async def broken(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"first\n"
            raise RuntimeError("the upstream went away mid-reply")

        async def cleanup() -> None:
            cleaned.set()

        return StreamWithCleanup(body(), cleanup=cleanup, media_type="text/plain")

    async def stream(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"first\n"
            await hold.wait()  # the client decides how this response ends
            yield b"last\n"

        async def cleanup() -> None:
            cleaned.set()

        return StreamWithCleanup(body(), cleanup=cleanup, media_type="text/plain")

    return Starlette(routes=[Route("/", hello), Route("/stream", stream),
                             Route("/broken", broken)])


async def test_port_zero_serves_on_the_port_it_got() -> None:
    server = HttpServer("127.0.0.1", 0, drain_seconds=1)
    server.bind()
    url = server.url
    assert not url.endswith(":0")
    await server.start(_app(cleaned=asyncio.Event(), hold=asyncio.Event()))
    try:
        async with httpx.AsyncClient() as client:
            reply = await client.get(url + "/")
        assert reply.text == "hello"
    finally:
        await server.stop()


def test_a_port_in_use_fails_when_bound_not_later() -> None:
    taken = bind_socket("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            HttpServer("127.0.0.1", port, drain_seconds=1).bind()
    finally:
        taken.close()


def test_the_socket_says_tcp_so_asyncio_turns_nagle_off() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
        assert not sock.getblocking()
    finally:
        sock.close()


def test_an_ipv6_url_has_its_host_in_brackets() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        sock = bind_socket("::1", 0)
    except OSError:
        pytest.skip("::1 cannot be bound here")
    try:
        assert socket_url(sock) == f"http://[::1]:{sock.getsockname()[1]}"
    finally:
        sock.close()


async def test_a_finished_stream_runs_its_cleanup() -> None:
    cleaned, hold = asyncio.Event(), asyncio.Event()
    hold.set()
    server = HttpServer("127.0.0.1", 0, drain_seconds=1)
    await server.start(_app(cleaned=cleaned, hold=hold))
    try:
        async with httpx.AsyncClient() as client:
            reply = await client.get(server.url + "/stream")
        assert reply.text == "first\nlast\n"
        async with asyncio.timeout(10):
            await cleaned.wait()
    finally:
        await server.stop()


async def test_a_client_that_leaves_mid_stream_still_runs_the_cleanup() -> None:
    cleaned, hold = asyncio.Event(), asyncio.Event()  # hold never set: the body waits
    server = HttpServer("127.0.0.1", 0, drain_seconds=1)
    await server.start(_app(cleaned=cleaned, hold=hold))
    try:
        async with (httpx.AsyncClient() as client,
                    client.stream("GET", server.url + "/stream") as reply):
            async for line in reply.aiter_lines():
                assert line == "first"
                break  # leave: the connection closes with the body unread
        async with asyncio.timeout(10):
            await cleaned.wait()
        assert not hold.is_set()
    finally:
        await server.stop()


async def test_a_stream_whose_body_fails_still_runs_the_cleanup() -> None:
    cleaned = asyncio.Event()
    server = HttpServer("127.0.0.1", 0, drain_seconds=1)
    await server.start(_app(cleaned=cleaned, hold=asyncio.Event()))
    try:
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.HTTPError):  # the reply ends without its last chunk
                await client.get(server.url + "/broken")
        async with asyncio.timeout(10):
            await cleaned.wait()
    finally:
        await server.stop()



async def _raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


_GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_the_parser_is_httptools_a_runtime_dependency() -> None:
    config = server_config(PlainTextResponse("x"), drain_seconds=1)
    assert isinstance(config.http, type) and issubclass(config.http, HttpToolsProtocol)


async def test_a_slow_header_after_a_reply_is_cut_the_second_time() -> None:
    # idle timeout far beyond the header deadline: only the header deadline can close it
    server = HttpServer("127.0.0.1", 0, drain_seconds=1, header_timeout=0.3,
                        idle_timeout=60)
    await server.start(_app(cleaned=asyncio.Event(), hold=asyncio.Event()))
    try:
        reader, writer = await _raw(server.url)
        writer.write(_GET)
        assert (await reader.readuntil(b"hello")).startswith(b"HTTP/1.1 200")
        writer.write(b"GET / HTTP/1.1\r\n")  # the second header never ends
        async with asyncio.timeout(30):
            assert await reader.read() == b""  # closed by the server
        writer.close()
    finally:
        await server.stop()


async def test_pipelined_requests_are_all_answered_under_the_deadline() -> None:
    server = HttpServer("127.0.0.1", 0, drain_seconds=1, header_timeout=0.3)
    await server.start(_app(cleaned=asyncio.Event(), hold=asyncio.Event()))
    try:
        reader, writer = await _raw(server.url)
        writer.write(_GET * 3)
        for _ in range(3):
            assert (await reader.readuntil(b"hello")).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await server.stop()


class _Sends:
    """Counts the transport writes (each a send system call) of the server's replies:
    the server side of each connection, a ``writelines`` as one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, port: int) -> None:
        from asyncio import selector_events

        self.calls = 0
        kind = selector_events._SelectorSocketTransport
        write, writelines = kind.write, kind.writelines
        inside = False

        def served(transport: asyncio.Transport) -> bool:
            return bool(transport.get_extra_info("sockname")[1] == port)

        def counted_write(transport: asyncio.Transport, data: bytes) -> None:
            if served(transport) and not inside:
                self.calls += 1
            write(transport, data)

        def counted_writelines(transport: asyncio.Transport, lines: list[bytes]) -> None:
            nonlocal inside
            if served(transport):
                self.calls += 1
            inside = True  # asyncio's writelines writes their join
            try:
                writelines(transport, lines)
            finally:
                inside = False

        monkeypatch.setattr(kind, "write", counted_write)
        monkeypatch.setattr(kind, "writelines", counted_writelines)


async def test_a_whole_reply_leaves_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    server = HttpServer("127.0.0.1", 0, drain_seconds=1)
    await server.start(_app(cleaned=asyncio.Event(), hold=asyncio.Event()))
    try:
        reader, writer = await _raw(server.url)
        sends = _Sends(monkeypatch, int(server.url.rsplit(":", 1)[1]))
        for _ in range(3):
            writer.write(_GET)
            reply = await reader.readuntil(b"hello")
            assert reply.startswith(b"HTTP/1.1 200") and b"content-length: 5" in reply
        assert sends.calls == 3  # on uvicorn's own cycle: six (a header, then a body)
        writer.close()
    finally:
        await server.stop()


async def test_a_header_whose_body_waits_is_not_held_back() -> None:
    """A stream whose first chunk is still to come, and a HEAD reply with no body
    write at all: the held header leaves at the end of the loop's turn."""
    go = asyncio.Event()

    async def later(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            await go.wait()
            yield b"at last\n"

        return StreamWithCleanup(body(), cleanup=_nothing, media_type="text/plain")

    app = Starlette(routes=[Route("/later", later),
                            Route("/", lambda _r: PlainTextResponse("hello"),
                                  methods=["GET", "HEAD"])])
    server = HttpServer("127.0.0.1", 0, drain_seconds=1)
    await server.start(app)
    try:
        reader, writer = await _raw(server.url)
        writer.write(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
        go.set()
        async with asyncio.timeout(5):
            assert b"at last" in await reader.readuntil(b"0\r\n\r\n")
        writer.write(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: 5" in head
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(5):
            rest = await reader.read()  # a reply that closes the connection: written first
        assert rest.startswith(b"HTTP/1.1 200") and rest.endswith(b"hello")
        writer.close()
    finally:
        await server.stop()


async def _nothing() -> None:
    return None
