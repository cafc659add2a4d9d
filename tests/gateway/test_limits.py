"""Fault 6 (issue 22): the gateway's resources are bounded.

A connection that sends its header slowly is closed; requests past the concurrency limit
and bodies past the buffered-bytes budget are answered 503 with ``Retry-After`` at once;
metric labels name route templates, never the paths clients send.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from kubemoot import serving
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import Fleet, start_gateway

CHAT = b'{"model": "small:1b", "messages": [{"role": "user", "content": "hi"}], "stream": false}'


@pytest.fixture
async def tight(make_emulator: Callable[..., OllamaEmulator]) -> AsyncIterator[GatewayServer]:
    settings = GatewaySettings(wait_limit_seconds=5.0, header_timeout_seconds=0.5,
                               max_concurrent_requests=1, max_buffered_bytes=1000)
    gateway = await start_gateway({"gpu-a": make_emulator()}, settings=settings)
    try:
        yield gateway
    finally:
        await gateway.stop()


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    return await asyncio.open_connection(where.hostname, where.port)


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent until it ended the connection (bounded: a hang fails).

    The end may come as a reset instead of an end of stream when the client is still
    sending: a byte that reaches the gateway after its last read and before the socket
    is closed is unread data, and a socket closed with unread data sends a RST (RFC 2525
    §2.17, what Linux does). The deadline promises that the connection ends and that no
    answer is sent; a reset keeps both, so it counts as the close. The gateway must not
    linger to read the attacker's bytes instead: freeing the socket is the point.
    """
    received = b""
    try:
        async with asyncio.timeout(30):
            while chunk := await reader.read(65_536):
                received += chunk
    except ConnectionResetError:
        pass
    return received


async def test_a_header_that_never_ends_is_closed(tight: GatewayServer) -> None:
    reader, writer = await _connect(tight.url)
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    await writer.drain()
    assert await _closed(reader) == b""  # closed without an answer
    writer.close()


async def test_a_header_sent_a_byte_at_a_time_is_closed(tight: GatewayServer) -> None:
    """Slowloris: each byte would reset an idle timer; the header deadline still ends it."""
    reader, writer = await _connect(tight.url)
    closing = asyncio.ensure_future(_closed(reader))
    header = b"GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000
    for byte in header:
        if closing.done():
            break
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            break
        await asyncio.sleep(0.05)  # the attacker's pace: a byte every 50 ms
    assert await closing == b""
    writer.close()


async def test_a_byte_sent_as_the_deadline_closes_ends_in_a_reset_without_an_answer(
        tight: GatewayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a loaded machine hits by chance, made certain: a byte lands between the
    deadline's close and the socket's; the client sees a reset, and still no answer."""
    protocol = getattr(serving, "_FastHeaderDeadline", serving._HeaderDeadline)
    too_slow = protocol._too_slow

    def closing_as_a_byte_arrives(self: Any) -> None:
        too_slow(self)
        writer.write(b"a")  # the attacker's next byte, unread by the closing gateway

    monkeypatch.setattr(protocol, "_too_slow", closing_as_a_byte_arrives)
    reader, writer = await _connect(tight.url)  # after the patch: the timer binds at connect
    writer.write(b"GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    await writer.drain()
    assert await _closed(reader) == b""  # ended by the reset, with no answer
    writer.close()


async def test_a_kept_alive_connection_gets_the_deadline_again(tight: GatewayServer) -> None:
    reader, writer = await _connect(tight.url)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    first = await reader.readuntil(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200")
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
    await writer.drain()
    rest = await _closed(reader)
    assert b"HTTP/1.1" not in rest.split(b"\r\n\r\n", 1)[-1]  # no second answer
    writer.close()


async def test_past_the_concurrency_limit_the_answer_is_503_at_once(
        tight: GatewayServer) -> None:
    assert tight.guard is not None
    guard = tight.guard
    _reader, writer = await _connect(tight.url)
    # a request whose body is still coming holds the one place
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 500\r\n\r\n{")
    await writer.drain()
    await wait_until(lambda: guard.in_flight == 1, timeout=30, what="the first request in")
    async with httpx.AsyncClient(base_url=tight.url) as http:
        refused = await http.post("/api/chat", content=CHAT)
        assert refused.status_code == 503
        assert refused.json()["error"].startswith("the gateway is serving its limit")
        assert int(refused.headers["retry-after"]) >= 1
        # probes still answer when the gateway is full
        assert (await http.get("/healthz")).status_code == 200
        writer.close()
        await wait_until(lambda: guard.in_flight == 0, timeout=30, what="the place freed")
        assert (await http.post("/api/chat", content=CHAT)).status_code == 200


@pytest.fixture
async def two_places(make_emulator: Callable[..., OllamaEmulator]
                     ) -> AsyncIterator[GatewayServer]:
    settings = GatewaySettings(wait_limit_seconds=5.0, max_buffered_bytes=1000)
    gateway = await start_gateway({"gpu-a": make_emulator()}, settings=settings)
    try:
        yield gateway
    finally:
        await gateway.stop()


async def test_bodies_held_together_are_bounded(two_places: GatewayServer) -> None:
    assert two_places.guard is not None
    guard = two_places.guard
    _reader, writer = await _connect(two_places.url)
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 5000\r\n\r\n" + b" " * 800)
    await writer.drain()
    await wait_until(lambda: guard.buffered >= 800, timeout=30, what="800 bytes held")
    async with httpx.AsyncClient(base_url=two_places.url) as http:
        padded = CHAT[:-1] + b', "pad": "' + b"x" * 400 + b'"}'
        refused = await http.post("/api/chat", content=padded)
        assert refused.status_code == 503, refused.text
        assert "request bodies" in refused.json()["error"]
        assert "retry-after" in refused.headers
        writer.close()
        await wait_until(lambda: guard.buffered == 0, timeout=30, what="the bytes let go")
        assert (await http.post("/api/chat", content=padded)).status_code == 200


async def test_metric_labels_are_route_templates_not_paths(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        for name in ("aZ9-first-random", "bQ7-second-random"):
            await http.get(f"/v1/models/{name}")
        await http.get("/no/such/route/xyz-random")
        text = (await http.get("/metrics")).text
    assert "random" not in text
    assert 'route="/v1/models/{model:path}"' in text
    assert 'route="unmatched"' in text
