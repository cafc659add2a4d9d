"""The gateway's connections to its engines: one pooled HTTP client, cheap to reuse.

httpx's pool (httpcore) asks each kept-alive connection, before reusing it, whether
the engine closed it meanwhile: it looks the connection's socket up through anyio,
which builds a fresh table of every socket attribute (the peer's address among them,
a system call) on each lookup. Under load that lookup was about a tenth of the
gateway's time (docs/performance.md, ``bench/hotpaths.py --path gateway``). Here each
connection learns its socket once, when it is opened, and answers from that.
"""

from __future__ import annotations

import select
import socket
import typing
from collections.abc import Iterable

import httpcore
import httpx
from httpcore import AsyncNetworkStream

__all__ = ["upstream_client"]


def upstream_client(*, timeout: httpx.Timeout, connections: int) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for calls to engines, keeping up to ``connections`` open.

    The pool is as large as its keep-alive set: a connection handed back is kept for
    the next call rather than closed and opened again.
    """
    return httpx.AsyncClient(timeout=timeout, transport=_Transport(connections))


class _Transport(httpx.AsyncHTTPTransport):
    """httpx's transport over a pool whose connections know their socket."""

    def __init__(self, connections: int) -> None:
        limits = httpx.Limits(max_connections=connections,
                              max_keepalive_connections=connections)
        super().__init__(limits=limits)
        # httpx builds its pool without a way to pass the network backend; the pool is
        # replaced by the same one (same limits) over ours.
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_KnownSocketBackend())


class _KnownSocketBackend(httpcore.AnyIOBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[typing.Any] | None = None,
                          ) -> AsyncNetworkStream:
        stream = await super().connect_tcp(host, port, timeout=timeout,
                                           local_address=local_address,
                                           socket_options=socket_options)
        return _KnownSocketStream(stream)


class _KnownSocketStream(AsyncNetworkStream):
    """A connection that looked its socket up once, when it was opened."""

    def __init__(self, inner: AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket: socket.socket | None = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "socket":
            return self._socket
        if info == "is_readable":
            # readable while idle: the engine closed it (or sent what nobody asked for)
            return self._socket is None or _readable(self._socket)
        return self._inner.get_extra_info(info)


def _readable(sock: socket.socket) -> bool:
    """Would a read return at once (data, or the end of a closed connection)?"""
    fd = sock.fileno()
    if fd < 0:  # closed here: the next read ends at once too
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
