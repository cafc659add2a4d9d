"""Fault hooks: what a broken or hostile engine answers instead of the real thing.

A test arms a fault (:meth:`Faults.fail_next`, :meth:`Faults.hostile_next`,
:meth:`Faults.stall_next`); the next matching request gets it in place of its answer.
The server's route table wraps each engine route with :meth:`Faults.wrap`, so faults
reach the Ollama and the OpenAI routes alike and nothing else needs to know about them.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["Faults", "HostileKind"]

HostileKind = Literal["malformed", "not-json", "wrong-shape", "hostile-values",
                      "escaped-name", "nested", "huge", "truncated", "dies-mid-stream"]
_MIB = 1024 * 1024


@dataclass(slots=True)
class _Fault:
    kind: str
    path: str | None
    remaining: int
    status: int = 500
    seconds: float = 0.0


class _RawTruncated:
    """An ASGI response that promises more body than it sends, then ends."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"4096")]})
        # returning mid-body makes the server drop the connection, which is exactly
        # what a client sees when an engine dies mid-answer
        await send({"type": "http.response.body", "body": b'{"models": [{"na',
                    "more_body": True})


class _DiesMidStream:
    """An NDJSON stream whose engine dies after its first line: the chunked body never
    ends (no final chunk), as when an Ollama runner crashes mid-answer."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        await send({"type": "http.response.body", "more_body": True,
                    "body": b'{"model":"x","created_at":"2024-01-01T00:00:00Z",'
                            b'"message":{"role":"assistant","content":"Hel"},'
                            b'"response":"Hel","done":false}\n'})


def _hostile_response(kind: str) -> Response | _RawTruncated | _DiesMidStream:
    if kind == "malformed":
        return Response(b'{"models": [{"name": "qwen3:8b", "size_vram": 12',
                        media_type="application/json")
    if kind == "not-json":
        return Response(b"<html><body>502 Bad Gateway</body></html>",
                        media_type="application/json")
    if kind == "wrong-shape":
        return JSONResponse({"models": "all of them", "message": 42})
    if kind == "hostile-values":
        return JSONResponse({"models": [{"name": "\x1b[31mx\x1b[0m" * 50,
                                         "size_vram": -(2**60), "context_length": "lots",
                                         "expires_at": "yesterday"}],
                             "message": {"role": "assistant", "content": None}})
    if kind == "escaped-name":
        # well-typed, so a client that checks types lists it: only the name is garbage
        # (terminal escapes); the first entry is a plain one, to tell entry from answer
        good = {"name": "plain:1b", "model": "plain:1b", "size": _MIB, "size_vram": _MIB,
                "digest": "0" * 64, "expires_at": "2030-01-01T00:00:00Z"}
        bad = {**good, "name": "\x1b[2J\x1b[31mevil:1b\x1b[0m",
               "model": "\x1b[2J\x1b[31mevil:1b\x1b[0m"}
        return JSONResponse({"models": [good, bad]})
    if kind == "nested":
        return Response(b"[" * 200_000 + b"]" * 200_000, media_type="application/json")
    if kind == "huge":
        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"models": [], "pad": "'
            for _ in range(64):  # 64 MiB, far past any sane answer
                yield b"x" * _MIB
            yield b'"}'
        return StreamingResponse(chunks(), media_type="application/json")
    if kind == "truncated":
        return _RawTruncated()
    if kind == "dies-mid-stream":
        return _DiesMidStream()
    raise ValueError(f"unknown hostile kind {kind!r}")


class Faults:
    """Armed faults, taken by the requests they match (thread-safe: tests arm them from
    another thread than the server's)."""

    def __init__(self) -> None:
        self._armed: list[_Fault] = []
        self._lock = threading.Lock()

    def _arm(self, fault: _Fault) -> None:
        with self._lock:
            self._armed.append(fault)

    def fail_next(self, status: int = 500, *, count: int = 1, path: str | None = None) -> None:
        """The next ``count`` requests (to ``path``, or any) answer HTTP ``status``."""
        self._arm(_Fault("status", path, count, status=status))

    def hostile_next(self, kind: HostileKind, *, count: int = 1,
                     path: str | None = None) -> None:
        """The next ``count`` requests get a malformed, truncated or hostile body."""
        _hostile_response(kind)  # reject unknown kinds now, not mid-request
        self._arm(_Fault(kind, path, count))

    def stall_next(self, seconds: float, *, count: int = 1, path: str | None = None) -> None:
        """The next ``count`` requests wait ``seconds`` (real) before being served."""
        self._arm(_Fault("stall", path, count, seconds=seconds))

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()

    def _take(self, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._armed:
                if fault.path is None or fault.path == path:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._armed.remove(fault)
                    return fault
        return None

    def wrap(self, endpoint: Callable[[Request], Awaitable[Any]],
             ) -> Callable[[Request], Awaitable[Any]]:
        """``endpoint`` behind the armed faults: a pending fault answers in its place (a
        stall first waits, then lets the endpoint answer)."""
        @functools.wraps(endpoint)
        async def answer(request: Request) -> Any:
            if (faulted := await self._answer(request)) is not None:
                return faulted
            return await endpoint(request)
        return answer

    async def _answer(self, request: Request
                      ) -> Response | _RawTruncated | _DiesMidStream | None:
        fault = self._take(request.url.path)
        if fault is None:
            return None
        if fault.kind == "stall":
            await asyncio.sleep(fault.seconds)  # real time: it exists to trip timeouts
            return None
        if fault.kind == "status":
            return JSONResponse({"error": f"injected failure (HTTP {fault.status})"},
                                status_code=fault.status)
        return _hostile_response(fault.kind)
