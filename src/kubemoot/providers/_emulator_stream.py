"""A whole (unstreamed) emulator answer that gives its engine slot back when the client
leaves.

Ollama cancels a generation whose client hung up; so does the emulator, so a test of a
client that goes away sees the slot free at once instead of after the emulated answer.
Streamed answers get the same from :class:`kubemoot.serving.StreamWithCleanup`.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import Request

from kubemoot.providers._emulated_calls import Generation

__all__ = ["run_unless_abandoned"]


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
