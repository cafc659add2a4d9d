"""Every way a gateway call ends releases its ticket, each way on its own.

A call's ticket goes back when its answer ends (read whole, or streamed to the end),
when its client leaves in the middle of a stream, and when its client leaves before
the engine answered. Each test below drives one of those endings through HTTP with a
real client and reads the ticket documents, so each release path is held by a test
of its own; an answer that ended well also counts as a success (the circuit and the
latency average learn from it), one whose client left does not.

One home each (issue 26 item 7): removing any one of the reader's ``finally``
(``PlacedCall.lines``, ``PlacedCall.json``), the stream's cleanup (``_call_stream``) or
the open's ``except`` (``CallDesk.start``; held by ``test_hang_up_during_load.py``)
fails a test; the shutdown closes no call of its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
import ollama
import pytest

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.testing.waiting import until_stored
from tests.gateway.conftest import Finished, finished_calls, live_tickets, start_gateway

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture
async def one_card(
    make_emulator: Callable[..., OllamaEmulator],
) -> AsyncIterator[tuple[GatewayServer, OllamaEmulator, Finished]]:
    # one emulated second per token (a real millisecond at the card's scale): long
    # answers stream for a while, so a client can leave in the middle of one
    emulator = make_emulator(per_token_s=1000.0)
    gateway = await start_gateway({"gpu-a": emulator})
    try:
        yield gateway, emulator, finished_calls(gateway)
    finally:
        await gateway.stop()


async def _holding(gateway: GatewayServer, count: int) -> None:
    assert gateway.stack is not None

    async def held() -> bool:
        return len(await live_tickets(gateway)) == count

    await until_stored(gateway.stack.tickets_bucket, held, timeout=30,
                       what=f"{count} ticket(s) held")


async def test_a_stream_read_to_its_end_releases_as_a_success(one_card) -> None:
    gateway, _emulator, finished = one_card
    client = ollama.AsyncClient(host=gateway.url)
    parts = [p async for p in await client.chat(model="small:1b", messages=HELLO,
                                                 stream=True, options={"num_predict": 2})]
    assert parts[-1].done
    await finished.until(1)
    assert [r.ok for r in finished.records] == [True]
    assert await live_tickets(gateway) == []


async def test_a_whole_answer_releases_as_a_success(one_card) -> None:
    gateway, _emulator, finished = one_card
    client = ollama.AsyncClient(host=gateway.url)
    reply = await client.chat(model="small:1b", messages=HELLO, options={"num_predict": 2})
    assert reply.done
    await finished.until(1)
    assert [r.ok for r in finished.records] == [True]
    assert await live_tickets(gateway) == []


async def test_a_client_that_leaves_mid_stream_releases_its_ticket(one_card) -> None:
    gateway, _emulator, finished = one_card
    body = {"model": "small:1b", "messages": HELLO, "stream": True,
            "options": {"num_predict": 100_000}}  # minutes of tokens: it leaves first
    async with (httpx.AsyncClient(base_url=gateway.url, timeout=30) as http,
                http.stream("POST", "/api/chat", json=body) as response):
        assert response.status_code == 200
        first = json.loads(await anext(response.aiter_lines()))
        assert first["done"] is False
        await _holding(gateway, 1)
    # the response and its connection are closed: the client left, the answer unfinished
    await finished.until(1)
    assert [r.ok for r in finished.records] == [False]  # no success to learn from
    assert await live_tickets(gateway) == []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_client_that_leaves_before_the_engine_answers_releases(
    one_card, stream: bool
) -> None:
    gateway, emulator, finished = one_card
    emulator.stall_next(600.0, path="/api/chat")  # the engine never answers in time
    body = {"model": "small:1b", "messages": HELLO, "stream": stream}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        asking = asyncio.create_task(http.post("/api/chat", json=body))
        await _holding(gateway, 1)
        asking.cancel()  # the client hangs up while the engine is still silent
        with pytest.raises(asyncio.CancelledError):
            await asking
    await finished.until(1)
    assert [r.ok for r in finished.records] == [False]
    assert await live_tickets(gateway) == []
