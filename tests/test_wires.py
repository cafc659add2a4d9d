"""bench/wires.py, the gateway bench's load generator: it counts only answers, keeps
its connections alive, opens a new one when the server closes, and does not take a cut
answer for a whole one. Against a scripted socket server (raw bytes, no framework)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from wires import Wire, WireClosed, Wires, request_bytes

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"2\r\n{}\r\n0\r\n\r\n")


class Script:
    """A server answering each request with the next of ``answers`` (cycled); counts
    the connections it accepted and the requests it read."""

    def __init__(self, *answers: bytes, close_after: int | None = None) -> None:
        self.answers, self.close_after = answers, close_after
        self.connections = self.requests = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                writer.write(self.answers[self.requests % len(self.answers)])
                self.requests += 1
                served += 1
                await writer.drain()
                if self.close_after is not None and served >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _url(script: Script) -> AsyncIterator[str]:
    server = await asyncio.start_server(script.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


@pytest.fixture
async def keeping() -> AsyncIterator[tuple[Script, str]]:
    script = Script(OK, BUSY, CHUNKED)
    async for url in _url(script):
        yield script, url


async def test_one_connection_serves_many_calls_and_only_answers_count(
    keeping: tuple[Script, str]
) -> None:
    script, url = keeping
    wires = Wires(url, "/api/chat", {"model": "m"}, clients=1)
    await wires.drive(0.2)
    assert script.connections == 1
    assert script.requests >= 3
    assert wires.answered + sum(wires.refused.values()) == script.requests
    assert set(wires.refused) == {503}
    assert wires.refused[503] == (script.requests + 1) // 3  # every third is a 503


async def test_a_server_that_closes_after_each_answer_gets_a_new_connection() -> None:
    script = Script(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
                    close_after=1)
    async for url in _url(script):
        wires = Wires(url, "/api/chat", {"model": "m"}, clients=2)
        await wires.drive(0.2)
        assert wires.answered == script.requests >= 4
        assert script.connections == script.requests


async def test_a_cut_answer_is_an_error_not_an_answer() -> None:
    script = Script(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", close_after=1)
    async for url in _url(script):
        wire = await Wire.open(url)
        with pytest.raises(WireClosed):
            await wire.call(request_bytes(url, "/api/chat", {"model": "m"}))
