"""Emulator answers that always give their engine slot back, streamed or whole.

Ollama cancels a generation whose client hung up; so does the emulator, so a test of a
client that goes away sees the slot free at once instead of after the emulated answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from kubemoot.providers._emulated_calls import Generation

__all__ = ["ReleasingStream", "run_unless_abandoned"]


class ReleasingStream(StreamingResponse):
    """Streams ``body`` and then closes ``generation`` however the stream ended:
    finished, failed, or dropped by a client that left before the first byte (then
    the body's own ``finally`` never runs, so the slot would otherwise stay taken)."""

    def __init__(self, body: AsyncIterator[bytes], generation: Generation, *,
                 media_type: str) -> None:
        super().__init__(body, media_type=media_type)
        self._generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._generation.close()


async def _hung_up(request: Request) -> None:
    # the body has been read, so the next message is the client's disconnect
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_unless_abandoned(request: Request, generation: Generation) -> str | None:
    """The whole answer of ``generation``; None when the client hung up first (the
    generation is then cancelled and its slot given back)."""
    work = asyncio.ensure_future(generation.run())
    gone = asyncio.ensure_future(_hung_up(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (gone, work):
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await generation.close()
    if work.cancelled():
        return None
    return work.result()
