"""The gateway's connections to its engines: keep-alive HTTP/1.1 on asyncio protocols.

Every call the gateway places is one request to an engine. Through httpx, the client
side of that request was about half of the gateway's time under load
(docs/performance.md, ``bench/hotpaths.py --path gateway``): httpcore scans every
connection of its pool for each request, asks each idle one whether the engine closed
it (a system call), and sends through two layers of stream wrappers (anyio, httpcore).
The gateway needs far less: a few requests of one shape (a JSON body, a JSON or NDJSON
answer) to a handful of engines. So each connection here is an :class:`asyncio.Protocol`
whose bytes go straight to httptools' C parser; an engine's idle connections wait in a
stack of their own, and the loop tells a connection the moment its engine hangs up, so
taking one is a pop, with no scan and no system call.

The error tree, in the order a request meets it::

    UpstreamError            the engine's answer did not arrive whole
    ├── ConnectFailed        no connection: not a byte of the request left
    ├── UpstreamTimeout      no connection, free connection or next byte in time
    └── ConnectionBroken     the engine hung up, or sent what is not HTTP
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
import socket
import ssl
import typing
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools

from kubemoot.gateway import jsoncodec

__all__ = [
    "ConnectFailed",
    "ConnectionBroken",
    "Upstream",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamTimeout",
]

#: How long an idle connection is kept for the next call. Engines close idle ones on
#: their own (uvicorn after 5 s); taking one they are about to close would lose the
#: request, so the gateway lets go of them first.
KEEPALIVE_SECONDS = 4.0
#: Answer bytes an unread response may buffer before the engine is asked to wait.
_READ_HIGH_WATER = 256 * 1024
#: The headers that say where an answer ends (else it ends with its connection).
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
#: Distinct URLs whose request head is kept ready (engines × paths: a handful).
_HEADS_KEPT = 1024


class UpstreamError(Exception):
    """The engine's answer did not arrive whole."""


class ConnectFailed(UpstreamError):
    """No connection to the engine: not a byte of the request left, so it may go
    elsewhere."""


class UpstreamTimeout(UpstreamError):
    """No connection, free connection or next byte of the answer within the timeout."""


class ConnectionBroken(UpstreamError):
    """The engine hung up before its answer was complete, or answered with what is not
    HTTP."""


@dataclass(frozen=True, slots=True)
class _Target:
    """Where one URL's requests go, and their heads up to the body's length."""

    key: tuple[str, str, int]  # scheme, host, port: one stack of idle connections each
    host: str
    port: int
    tls: bool
    post_head: bytes
    get_head: bytes


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectFailed(f"{url!r} is not an http:// or https:// URL")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.netloc.rsplit("@", 1)[-1]
    common = f"Host: {host}\r\nAccept: */*\r\nUser-Agent: kubemoot-gateway\r\n"
    return _Target(
        key=(parts.scheme, parts.hostname, port), host=parts.hostname, port=port, tls=tls,
        post_head=(f"POST {path} HTTP/1.1\r\n{common}"
                   "Content-Type: application/json\r\nContent-Length: ").encode("latin-1"),
        get_head=f"GET {path} HTTP/1.1\r\n{common}\r\n".encode("latin-1"))


class UpstreamResponse:
    """One engine answer: status and headers at once, the body as it comes.

    Read it with :meth:`read`, :meth:`json` or :meth:`lines`, then :meth:`aclose`: a
    body read to its end leaves the connection for the next call; closing one that is
    not cuts the connection, which also ends the engine's work on it.
    """

    __slots__ = ("_body", "_buffered", "_conn", "_done", "_error", "_loop", "_timeout",
                 "_waiter", "headers", "keep_alive", "status")

    def __init__(self, conn: _Connection, timeout: float) -> None:
        self._conn: _Connection | None = conn
        self._loop = conn.loop
        self._timeout = timeout
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._done = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False

    # -- fed by the connection -------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._body.append(data)
        self._buffered += len(data)
        if self._buffered > _READ_HIGH_WATER and self._conn is not None:
            self._conn.pause_reading()  # a slow reader: the engine waits, memory stays bounded
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if not self._done:
            self._error = error
            self._done = True
        self._wake()

    # -- read by the gateway ---------------------------------------------------------

    async def _next(self) -> bytes | None:
        """The next piece of the body (None at its end); raises how it broke."""
        while not self._body:
            if self._done:
                if self._error is not None:
                    raise self._error
                return None
            await _wait(self, "waiting for the rest of its answer")
        data = self._body.popleft()
        self._buffered -= len(data)
        if self._conn is not None and self._buffered <= _READ_HIGH_WATER:
            self._conn.resume_reading()
        return data

    async def read(self) -> bytes:
        """The whole body."""
        pieces = []
        while (data := await self._next()) is not None:
            pieces.append(data)
        return b"".join(pieces)

    async def json(self) -> Any:
        return jsoncodec.loads(await self.read())

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's non-blank lines, each ending in one newline, as the engine sent
        them (no decoding and encoding again: the bytes pass through)."""
        rest = b""
        while (data := await self._next()) is not None:
            if rest:
                data = rest + data
            *whole, rest = data.split(b"\n")
            for line in whole:
                if line.strip():
                    yield line + b"\n"
        if rest.strip():
            yield rest + b"\n"

    def header(self, name: bytes) -> bytes | None:
        """A header's value (``name`` in lower case), the first if it repeats."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def close(self) -> None:
        """Let go of the answer: kept for the next call if whole, else the connection is
        cut (ending the engine's work on it). Idempotent, and it never waits, so a call
        may close its answer where a cancellation cannot reach it half-way."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._done:
            conn.cut()

    async def aclose(self) -> None:
        """:meth:`close`, for callers that expect an awaitable close."""
        self.close()


async def _wait(response: UpstreamResponse, what: str) -> None:
    """Until the connection feeds ``response`` something, or its timeout passes."""
    loop = response._loop
    waiter = response._waiter = loop.create_future()
    timer = loop.call_later(response._timeout, _expire, waiter)
    try:
        await waiter
    except UpstreamTimeout:
        raise UpstreamTimeout(f"no answer from the engine within {response._timeout:g} s "
                              f"({what})") from None
    finally:
        timer.cancel()
        response._waiter = None


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout())


class _Connection(asyncio.Protocol):
    """One kept-alive connection to an engine: parses what it sends into the current
    response, and goes back to its pool when an answer is complete."""

    def __init__(self, pool: Upstream, target: _Target,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.target = target
        #: The loop the connection was opened on, kept: asking for the running loop makes
        #: a system call (getpid) on Python 3.11, and each call asked several times.
        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.lost = False
        self.counted = True  # holds one of the pool's places until it closes
        self.idle_since = 0.0
        self._reading_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._framed = False  # the answer has a length or chunks (else: until the close)
        self._poller: select.poll | None = None

    # -- asyncio's callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no subclass of asyncio's, but they are full transports
        self.transport = typing.cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is None:
            return
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # small requests must leave at once, not wait for the last one's ACK (Nagle)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            # nobody asked: an idle connection must not be handed out with stray bytes
            self.cut()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._broken(f"the engine's answer is not HTTP: {error}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        response = self.response
        if response is not None:
            if response.status and not self._framed:
                response._finish()  # an answer without a length ends with its connection
            else:
                response._fail(ConnectionBroken("the engine closed the connection before "
                                                "its answer was complete"))
            self.response = None
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionBroken("the engine closed the connection "
                                                          "while the request was sent"))
        self.pool._gone(self)

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- httptools' callbacks --------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.headers.append((name, value))
            if not self._framed and name.lower() in _FRAMING:
                self._framed = True

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        response.status = self.parser.get_status_code()
        response.keep_alive = self.parser.should_keep_alive()
        response._wake()

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        response, self.response = self.response, None
        if response is None:
            return
        response._finish()
        if response.keep_alive and not self.lost:
            response._conn = None  # the answer is whole: aclose has nothing to cut
            self.resume_reading()
            self.pool._release(self)
        else:
            self.cut()

    # -- the pool's and the response's -----------------------------------------------

    def reusable(self) -> bool:
        """Still open, with nothing unasked to read?

        The loop learns of an engine's hang-up only on its next turn, which may come
        after this connection is handed out again; a request sent on it then is lost.
        So the socket itself is asked (one ``poll`` on a poller made once per
        connection): readable while idle means closed, or bytes nobody asked for.
        """
        return not self.lost and not (self._poller is not None and self._poller.poll(0))

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self.lost:
            self._reading_paused = False
            self.transport.resume_reading()

    def cut(self) -> None:
        """Close the connection now (its engine stops working on a request it carried)."""
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def _broken(self, message: str) -> None:
        if self.response is not None:
            self.response._fail(ConnectionBroken(message))
            self.response = None
        self.cut()

    async def send(self, data: bytes, timeout: float) -> UpstreamResponse:
        """Write one request; the response, once its status and headers are in."""
        assert self.transport is not None
        response = self.response = UpstreamResponse(self, timeout)
        self._framed = False
        self.transport.write(data)
        if self._writable is not None:  # a large body: wait until the engine takes it
            await asyncio.wait_for(asyncio.shield(self._writable), timeout)
        while not response.status:
            if response._done:
                if response._error is not None:
                    raise response._error
                raise ConnectionBroken("the engine ended its answer before its status")
            await _wait(response, "waiting for its status line")
        return response


class Upstream:
    """Keep-alive HTTP/1.1 to engines: up to ``connections`` open at once, all engines
    together (one more call waits for a free one, as long as ``timeout``).

    ``timeout`` also bounds each wait for the engine's next bytes; ``connect_timeout``
    the opening of a connection.
    """

    def __init__(self, *, timeout: float, connect_timeout: float, connections: int,
                 keepalive_seconds: float = KEEPALIVE_SECONDS) -> None:
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.connections = max(1, connections)
        self.keepalive_seconds = keepalive_seconds
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._targets: dict[str, _Target] = {}
        self._tls: ssl.SSLContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def open_connections(self) -> int:
        return self._open

    async def post(self, url: str, body: bytes, *, timeout: float | None = None
                   ) -> UpstreamResponse:
        """POST a JSON ``body``; the response once its status and headers are in."""
        target = self._target_of(url)
        head = target.post_head + str(len(body)).encode() + b"\r\n\r\n"
        return await self._request(target, head + body, timeout)

    async def get(self, url: str, *, timeout: float | None = None) -> UpstreamResponse:
        target = self._target_of(url)
        return await self._request(target, target.get_head, timeout)

    async def aclose(self) -> None:
        """Close every idle connection; the ones in use close when their answer ends."""
        self._closed = True
        for stack in self._idle.values():
            for conn in stack:
                conn.cut()
        self._idle.clear()

    # -- the pool ----------------------------------------------------------------------

    def _target_of(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= _HEADS_KEPT:
                self._targets.clear()
            target = self._targets[url] = _target(url)
        return target

    async def _request(self, target: _Target, data: bytes, timeout: float | None
                       ) -> UpstreamResponse:
        timeout = self.timeout if timeout is None else timeout
        conn = await self._acquire(target, timeout)
        try:
            return await conn.send(data, timeout)
        except BaseException:
            conn.cut()  # given up (a timeout, the caller cancelled): the engine stops too
            raise

    async def _acquire(self, target: _Target, timeout: float) -> _Connection:
        if self._closed:
            raise ConnectFailed("the gateway's connections to engines are closed")
        loop = self._running_loop()
        while True:
            stack = self._idle.get(target.key)
            now = loop.time()
            while stack:
                conn = stack.pop()
                if now - conn.idle_since < self.keepalive_seconds and conn.reusable():
                    return conn
                self._discard(conn)  # dead, or about to be closed by the engine
            if self._open < self.connections:
                return await self._connect(target)
            if self._drop_one_idle():
                continue  # room made by closing another engine's idle connection
            waiter = loop.create_future()
            self._waiters.append(waiter)
            timer = loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            except UpstreamTimeout:
                raise UpstreamTimeout(f"no free connection to an engine within {timeout:g} s "
                                      f"({self.connections} are in use)") from None
            finally:
                timer.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _drop_one_idle(self) -> bool:
        for stack in self._idle.values():
            if stack:
                self._discard(stack.pop(0))  # the oldest: the least likely to be used soon
                return True
        return False

    def _discard(self, conn: _Connection) -> None:
        """Close an idle connection taken off its stack, and free its place now (its
        ``connection_lost`` comes later and does not count it again)."""
        conn.cut()
        if conn.counted:
            conn.counted = False
            self._open -= 1

    async def _connect(self, target: _Target) -> _Connection:
        self._open += 1
        loop = self._running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: _Connection(self, target, loop), target.host, target.port,
                ssl=self._ssl() if target.tls else None), self.connect_timeout)
        except TimeoutError:
            self._open -= 1
            self._wake_one()
            raise UpstreamTimeout(f"no connection to {target.host}:{target.port} within "
                                  f"{self.connect_timeout:g} s") from None
        except (OSError, ssl.SSLError) as error:
            self._open -= 1
            self._wake_one()
            raise ConnectFailed(f"cannot connect to {target.host}:{target.port}: "
                                f"{error}") from None
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise
        return conn

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the pool serves on, asked for once (see ``_Connection.loop``); again
        only if that one has closed (a pool used on a later loop, as tests do)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _ssl(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _release(self, conn: _Connection) -> None:
        """An answer is complete: keep its connection for the next call."""
        if self._closed:
            conn.cut()
            return
        conn.idle_since = conn.loop.time()
        self._idle.setdefault(conn.target.key, []).append(conn)
        self._wake_one()

    def _gone(self, conn: _Connection) -> None:
        """``conn`` closed (either side): free its place."""
        stack = self._idle.get(conn.target.key)
        if stack is not None and conn in stack:
            stack.remove(conn)
        if conn.counted:
            conn.counted = False
            self._open -= 1
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
