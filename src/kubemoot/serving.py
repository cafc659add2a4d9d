"""One way to serve HTTP: the listening socket, uvicorn on the running loop, cleanup streams.

Every web server of ours (the gateway, the dashboard, the Ollama emulator) wants the same
things from uvicorn, and each once wrote them out anew:

* the socket is bound *before* serving starts, so a port in use fails at once with
  ``OSError`` and port 0 is turned into the port actually taken (:func:`bind_socket`,
  :func:`socket_url`);
* uvicorn is quiet (warnings only, no access log, no lifespan) and its graceful drain is
  bounded (:func:`server_config`);
* HTTP is parsed by httptools (C) when it is installed, else by h11 (pure Python), with
  the same deadline for each request's header either way; a program's event loop is
  uvloop's when that is installed (:func:`event_loop_factory`);
* in a host program uvicorn leaves the signals alone: Ctrl-C and SIGTERM belong to
  :func:`kubemoot.cli._shutdown.run_until_stopped` (:class:`HttpServer`);
* a streamed reply that holds something (a ticket, an engine slot, a place among the
  live pages) gives it back however the response ends (:class:`StreamWithCleanup`).

This module imports nothing else of ours, so every adapter may use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import typing
from collections.abc import AsyncIterable, Awaitable, Callable, Iterator, Mapping

import h11
import uvicorn
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # the C parser: a request's header costs a few microseconds instead of h11's tens
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a runtime dependency
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

__all__ = ["HttpServer", "StreamWithCleanup", "bind_socket", "event_loop_factory",
           "server_config", "socket_url"]

#: How often :meth:`HttpServer.start` looks whether uvicorn is accepting yet.
_STARTUP_POLL_SECONDS = 0.01


def bind_socket(host: str, port: int, *, backlog: int = 128) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (``OSError`` when taken).

    Port 0 picks a free port; :func:`socket_url` tells which.
    """
    # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on connections of a
    # socket that says it is TCP; with Nagle on, every keep-alive reply waits for the
    # client's delayed ACK (about 40 ms a request).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # a restarted server may take its port back while old connections linger
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def socket_url(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket, the port it really got, IPv6 in brackets."""
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


#: How long a connection may take to send a request's whole header, by default.
HEADER_TIMEOUT_SECONDS = 10.0
#: How long a kept-alive connection may sit idle between requests, by default.
IDLE_TIMEOUT_SECONDS = 5.0


def server_config(app: ASGIApp, *, drain_seconds: int, log_level: str = "warning",
                  header_timeout: float = HEADER_TIMEOUT_SECONDS,
                  idle_timeout: float = IDLE_TIMEOUT_SECONDS) -> uvicorn.Config:
    """uvicorn's settings for one of our servers: quiet, no lifespan, a bounded drain.

    ``drain_seconds`` is how long replies still running may finish once the server is
    told to stop (uvicorn takes whole seconds). A connection that has not sent a whole
    request header ``header_timeout`` seconds after it opened (or after its previous
    reply) is closed; an idle kept-alive one after ``idle_timeout``.
    """

    base: type[asyncio.Protocol] = (_HeaderDeadline if HttpToolsProtocol is None
                                    else _FastHeaderDeadline)

    class Protocol(base):  # type: ignore[valid-type,misc]
        deadline = header_timeout

    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ClientLeft) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(_ClientLeft())

    return uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                          timeout_graceful_shutdown=drain_seconds, http=Protocol,
                          timeout_keep_alive=max(1, math.ceil(idle_timeout)))


class _ClientLeft(logging.Filter):
    """Drops uvicorn's traceback for a client that hung up while sending its body.

    The app learns of it as ``ClientDisconnect`` from the body read; nobody is left to
    answer and nothing on the server went wrong, so it is no "Exception in ASGI
    application".
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ClientDisconnect))


class _HeaderTimer:
    """One connection's header deadline: armed when it waits for a header, disarmed
    when the header is in; ``expired`` runs when the deadline passes first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float,
                 expired: Callable[[], None]) -> None:
        self._loop = loop
        self._deadline = deadline
        self._expired = expired
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        self.disarm()
        self._handle = self._loop.call_later(self._deadline, self._fire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._expired()


class _HeaderDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's header.

    uvicorn times out idle kept-alive connections, but any byte resets that timer, and
    a fresh connection has none at all: a client that sends its header a byte at a time
    (slowloris) holds a socket and a buffer for as long as it likes. Here the header
    must be complete within ``deadline`` seconds of the connection opening, or of the
    previous reply ending; otherwise the connection is closed.
    """

    deadline: float = HEADER_TIMEOUT_SECONDS

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._timer = _HeaderTimer(self.loop, self.deadline, self._too_slow)
        self._timer.arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._timer.disarm()  # the header is in: the request's own handling takes over

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._timer.arm()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.disarm()
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class _HeadWithBody:
    """A connection's transport as one reply's cycle writes to it: the reply's first
    write (uvicorn's status line and headers) is held until its next write, so a whole
    reply leaves in one system call instead of two.

    uvicorn writes the header when the app sends ``http.response.start`` and the body
    with the next message, which for a whole answer comes in the same turn of the loop;
    each write was a ``send`` of its own, the costliest system call a gateway call
    makes (on loopback the kernel delivers the segment to the reader in the writer's
    time). The held header leaves with the next write, at the end of the loop's turn
    if no write came (a stream whose first chunk is still to come), or before the
    transport closes: never later than that. Everything else is the transport's own.
    """

    __slots__ = ("_held", "_loop", "_started", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._started = False

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))  # one writev
        elif not self._started:
            self._started = True  # only the reply's first write (its header) waits
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """Write the held header now (nothing if it already left)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


if HttpToolsProtocol is not None:

    class _FastHeaderDeadline(HttpToolsProtocol):
        """uvicorn's httptools protocol with the same header deadline as
        :class:`_HeaderDeadline`.

        httptools keeps no connection state to ask, so the protocol counts: while as
        many headers came in as replies went out, the connection waits for a header
        (a pipelined request whose header is already in is not cut by the deadline the
        previous reply armed).
        """

        deadline: float = HEADER_TIMEOUT_SECONDS
        _headers_in = 0
        _replies_out = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._timer = _HeaderTimer(self.loop, self.deadline, self._too_slow)
            self._timer.arm()

        def on_headers_complete(self) -> None:
            self._headers_in += 1
            self._timer.disarm()  # the header is in: the request's own handling takes over
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.transport is self.transport:
                # the cycle writes through it as through the transport it stands for
                cycle.transport = typing.cast(asyncio.Transport,
                                              _HeadWithBody(self.transport, self.loop))

        def on_response_complete(self) -> None:
            self._replies_out += 1
            super().on_response_complete()
            if not self.transport.is_closing() and self._headers_in == self._replies_out:
                self._timer.arm()  # the next request on this connection gets the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._timer.disarm()
            super().connection_lost(exc)

        def _too_slow(self) -> None:
            if self._headers_in == self._replies_out and not self.transport.is_closing():
                self.transport.close()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (for ``asyncio.Runner``), else None.

    A server spends much of each request in the loop's socket writes and callbacks;
    uvloop does those in C.
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a runtime dependency on Linux
        return None
    return uvloop.new_event_loop


class _HostedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the host program owns Ctrl-C and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """An ASGI app served by uvicorn on the running event loop, on a socket bound first.

    :meth:`bind` takes the socket (so the caller learns of a port in use before it
    wires anything else, and :attr:`url` is known); :meth:`start` serves and returns
    once connections are accepted; :meth:`stop` drains, stops and closes the socket.
    """

    def __init__(self, host: str, port: int, *, drain_seconds: int, backlog: int = 128,
                 log_level: str = "warning",
                 header_timeout: float = HEADER_TIMEOUT_SECONDS,
                 idle_timeout: float = IDLE_TIMEOUT_SECONDS) -> None:
        self.host, self.port = host, port
        self.drain_seconds = drain_seconds
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.backlog = backlog
        self.log_level = log_level
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None

    @property
    def bound(self) -> bool:
        return self._socket is not None

    @property
    def url(self) -> str:
        if self._socket is None:
            raise RuntimeError(f"nothing listens on {self.host}:{self.port} yet")
        return socket_url(self._socket)

    def bind(self) -> None:
        """Take the listening socket now (``OSError`` when the address is taken)."""
        if self._socket is None:
            self._socket = bind_socket(self.host, self.port, backlog=self.backlog)

    async def start(self, app: ASGIApp) -> None:
        """Serve ``app``; returns once uvicorn accepts, raises what stopped its startup."""
        self.bind()
        assert self._socket is not None
        server = self._server = _HostedServer(
            server_config(app, drain_seconds=self.drain_seconds, log_level=self.log_level,
                          header_timeout=self.header_timeout,
                          idle_timeout=self.idle_timeout))
        self._serving = asyncio.get_running_loop().create_task(server.serve([self._socket]))
        # uvicorn says it has started only through this flag
        while not server.started:
            if self._serving.done():
                await self._serving  # surfaces the startup error
                raise RuntimeError(f"the server on {self.url} stopped during startup")
            await asyncio.sleep(_STARTUP_POLL_SECONDS)

    async def wait(self) -> None:
        """Serve until the server stops (cancelling this leaves the server running)."""
        if self._serving is not None:
            await asyncio.shield(self._serving)

    async def stop(self) -> None:
        """Let replies drain (up to ``drain_seconds``), stop serving, close the socket."""
        if self._server is not None:
            self._server.should_exit = True
        if self._serving is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._serving
        if self._socket is not None:
            self._socket.close()


class StreamWithCleanup(StreamingResponse):
    """A streamed response that awaits ``cleanup`` however it ends.

    Finished, left by its client, failed (the body raised) or cut (the server cancels
    requests still running when its drain ends). The body's own ``finally`` is not
    enough: a body that never started (the client left before the first byte) never
    runs it; and Starlette's ``background`` task is skipped when the body raises or the
    request is cancelled.
    """

    def __init__(self, content: AsyncIterable[str | bytes], *,
                 cleanup: Callable[[], Awaitable[None]], media_type: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._cleanup()
