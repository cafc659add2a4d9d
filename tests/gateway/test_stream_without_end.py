"""An OpenAI stream whose engine answer never said ``done`` ends with an error event.

The OpenAI routes translate the engine's NDJSON lines into server-sent events and skip
lines that do not parse. An engine that answers 200 with a body of no usable line (a
proxy's HTML page, a torn JSON document, one nested too deeply for the decoder) used
to end in ``data: [DONE]`` with no content at all: the ``openai`` client took an empty
answer for a whole one. A real Ollama stream always ends with a ``done`` line or an
error line, so a stream without one is incomplete and must say so (docs/gateway.md,
When things break); the next call runs, and no ticket is left.
"""

from __future__ import annotations

import openai
import pytest

from kubemoot.emulation.faults import HostileKind
from tests.gateway.conftest import Fleet

HELLO = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("kind", ["not-json", "malformed", "nested"])
@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_a_stream_that_never_ends_properly_is_an_error(
        fleet: Fleet, kind: HostileKind, route: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key="x", max_retries=0)
    first = await client.chat.completions.with_raw_response.create(model="small:1b",
                                                                   messages=HELLO)
    where = first.headers["x-kubemoot-provider"]
    path = "/api/chat" if route == "chat" else "/api/generate"
    fleet.emulators[where].hostile_next(kind, path=path)
    chunks = 0
    with pytest.raises(openai.APIError) as cut:
        if route == "chat":
            stream = await client.chat.completions.create(
                model="small:1b", messages=HELLO, stream=True)  # type: ignore[arg-type]
        else:
            stream = await client.completions.create(model="small:1b", prompt="hi",
                                                     stream=True)  # type: ignore[assignment]
        async for _ in stream:
            chunks += 1
    assert "complete" in cut.value.message
    for _ in range(2):
        again = await client.chat.completions.create(model="small:1b", messages=HELLO)
        assert again.choices[0].message.content
    await fleet.finished.until(4)
    assert await fleet.tickets_left() == []
