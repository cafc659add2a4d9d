"""HTTP helpers both APIs' handlers share: reading a request body, and a whole
(unstreamed) answer that gives its engine slot back when the client leaves.

Ollama cancels a generation whose client hung up; so does the emulator, so a test of a
client that goes away sees the slot free at once instead of after the emulated answer.
Streamed answers get the same from :class:`kubemoot.serving.StreamWithCleanup`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.requests import Request

from kubemoot.emulation.calls import Generation
from kubemoot.emulation.card import EmulatorError

__all__ = ["read_body", "run_unless_abandoned"]


async def read_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, or a 400 (never a traceback) for anything else."""
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise EmulatorError(400, "invalid JSON body") from None
    except RecursionError:  # Go's decoder stops at a depth limit too, with a 400
        raise EmulatorError(400, "invalid JSON body: nested too deeply") from None
    if not isinstance(body, dict):
        raise EmulatorError(400, "the body must be a JSON object")
    return body


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
