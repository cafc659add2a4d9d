"""A streamed emulator answer that always gives its engine slot back."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from kubemoot.providers._emulated_calls import Generation


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
