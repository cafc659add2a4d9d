"""Issue 22 fault 3: a stream cut after its first byte ends with an error the client
sees (DESIGN §9), and a gateway that begins to shut down places no more calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

import httpx
import ollama
import openai
import pytest

from kubemoot.clock import SystemClock
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import Fleet, OllamaEmulator, sources

HELLO = [{"role": "user", "content": "hello"}]


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


async def test_an_engine_dying_mid_stream_ends_the_ollama_stream_with_an_error(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    for emulator in fleet.emulators.values():
        emulator.hostile_next("dies-mid-stream", path="/api/chat")
    client = ollama.AsyncClient(host=fleet.url)
    got: list[str] = []
    with caplog.at_level(logging.WARNING), pytest.raises(ollama.ResponseError) as raised:
        async for part in await client.chat(model="small:1b", messages=HELLO, stream=True):
            got.append(part.message.content or "")
    assert got == ["Hel"]  # what came before the engine died, then the error
    assert "broke before the answer was complete" in str(raised.value)
    _no_traceback(caplog)
    await fleet.finished.until(1)
    assert await fleet.tickets_left() == []


async def test_an_engine_dying_mid_stream_ends_the_openai_stream_with_an_error_event(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    for emulator in fleet.emulators.values():
        emulator.hostile_next("dies-mid-stream", path="/api/chat")
    client = openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key="none", max_retries=0)
    got: list[str] = []
    with caplog.at_level(logging.WARNING), pytest.raises(openai.APIError) as raised:
        stream = await client.chat.completions.create(model="small:1b", messages=HELLO,
                                                      stream=True)  # type: ignore[arg-type]
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content or "")
    assert "".join(got) == "Hel"
    assert "broke before the answer was complete" in raised.value.message
    _no_traceback(caplog)


async def test_a_raw_stream_cut_by_the_engine_ends_with_one_error_line(fleet: Fleet) -> None:
    for emulator in fleet.emulators.values():
        emulator.hostile_next("dies-mid-stream", path="/api/generate")
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{fleet.url}/api/generate",
                                json={"model": "small:1b", "prompt": "hello"})
    assert reply.status_code == 200  # the headers were sent before the engine died
    lines = reply.text.splitlines()
    assert '"error"' in lines[-1] and '"error"' not in lines[0], lines


async def test_the_drain_refuses_a_waiting_call_at_once_and_lets_the_started_one_end(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    # one slot; the first call streams for a few seconds, the second waits behind it
    emulator = make_emulator(num_parallel=1, time_scale=1.0, base_latency_s=0.0,
                             per_token_s=0.3)
    [source] = sources({"gpu": emulator})
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=[replace(source, num_parallel=1)],
                            port=0, settings=GatewaySettings(wait_limit_seconds=60.0,
                                                             drain_seconds=60))
    await gateway.start()
    stopping: asyncio.Task[None] | None = None
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as http:
            body = {"model": "small:1b", "messages": HELLO, "stream": True}
            async with http.stream("POST", "/api/chat", json=body) as first:
                assert first.status_code == 200
                lines = first.aiter_lines()
                assert '"done":false' in (await anext(lines)).replace(" ", "")
                second = asyncio.ensure_future(http.post("/api/chat", json=body))
                assert gateway.stack is not None
                demand = gateway.stack.demand_bucket
                await wait_until(lambda: _waiting(demand), timeout=30,
                                 what="the second call waiting for the slot")
                stopping = asyncio.ensure_future(gateway.stop())
                refused = await second
                # answered while the first still streams: not placed, not sent
                assert refused.status_code == 503, refused.text
                assert "shutting down" in refused.json()["error"]
                assert refused.headers["retry-after"] == "1"
                rest = [line async for line in lines]
            # the started stream ends whole within the drain
            assert '"done":true' in rest[-1].replace(" ", ""), rest
            assert all('"error"' not in line for line in rest)
        assert len(emulator.records) == 1  # the refused call never reached the engine
    finally:
        if stopping is not None:
            await stopping
        else:
            await gateway.stop()


async def _waiting(demand: object) -> bool:
    keys = await demand.keys()  # type: ignore[attr-defined]
    return any(str(k).startswith("wait") for k in keys)
