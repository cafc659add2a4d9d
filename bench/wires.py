"""A lean HTTP/1.1 load generator for the gateway bench: raw keep-alive sockets.

httpx costs its caller 3–5 ms of CPU per call (its pool, anyio, the request and response
models). On a two-core machine that the load generator shares with the gateway and the
engine, that CPU is taken from the very processes being measured, so the throughput
ratio measured the client more than the gateway. A ``Wire`` is one keep-alive connection
as an asyncio protocol: the request is encoded once, each call is one ``write``, and the
answer goes through httptools' C parser without being kept (only its status and the end
of the message matter to the bench). Run it under uvloop (``run``) for the cheapest loop.

Only what the bench needs: ``POST`` with a fixed JSON body, answers with a length or
chunked (both ends of the message are the parser's), one call at a time per connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit

import httptools

try:
    import uvloop
except ImportError:  # pragma: no cover - Windows: the standard loop
    uvloop = None


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run`` on uvloop's loop where it is installed."""
    if uvloop is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)


def request_bytes(url: str, path: str, body: object) -> bytes:
    """One ``POST`` of ``body`` as JSON to ``url`` + ``path``, keep-alive, as bytes."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    host = urlsplit(url).netloc
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n")
    return head.encode("ascii") + payload


class WireClosed(ConnectionError):
    """The server closed the connection before the answer ended."""


class Wire(asyncio.Protocol):
    """One keep-alive connection; ``call`` sends a request and waits for its status."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[int] | None = None
        self.keep_alive = True

    @classmethod
    async def open(cls, url: str) -> Wire:
        parts = urlsplit(url)
        loop = asyncio.get_running_loop()
        _, wire = await loop.create_connection(cls, parts.hostname, parts.port or 80)
        return wire

    async def call(self, request: bytes) -> int:
        """Send one request; the answer's status once its last byte has arrived."""
        if self._transport is None or self._transport.is_closing():
            raise WireClosed("the connection is closed")
        self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return await self._answer

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, but behave as one
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(WireClosed(f"bad answer: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(WireClosed("the server closed the connection"))

    # httptools' callbacks
    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_result(self._parser.get_status_code())
        if not self.keep_alive:
            self.close()

    def _fail(self, error: Exception) -> None:
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_exception(error)


class Wires:
    """``clients`` connections to one URL, each posting one request in a loop."""

    def __init__(self, url: str, path: str, body: object, clients: int) -> None:
        self.url, self.clients = url, clients
        self.request = request_bytes(url, path, body)
        self.answered = 0
        self.refused: dict[int, int] = {}

    async def _client(self, end: float) -> None:
        wire = await Wire.open(self.url)
        try:
            while time.perf_counter() < end:
                if not wire.keep_alive:
                    wire = await Wire.open(self.url)
                status = await wire.call(self.request)
                if status == 200:
                    self.answered += 1  # only answers count; a refusal is no throughput
                else:
                    self.refused[status] = self.refused.get(status, 0) + 1
        finally:
            wire.close()

    async def drive(self, seconds: float) -> float:
        """Post for ``seconds``; answered calls per second of the run."""
        began = time.perf_counter()
        await asyncio.gather(*(self._client(began + seconds) for _ in range(self.clients)))
        return self.answered / (time.perf_counter() - began)
