"""The emulator's embeddings, ``truncate: false``, OpenAI-compatible routes and stats,
exercised with the official ``ollama`` and ``openai`` clients over real HTTP."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import ollama
import openai
import pytest

from kubemoot.emulation.server import EMULATOR_VERSION, OllamaEmulator
from tests.providers.conftest import LARGE, MEDIUM, SMALL

LONG = "word " * 2000  # ~2500 tokens: longer than the 1024-token context of FAST_CARD
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture
async def client(emulator: OllamaEmulator) -> AsyncIterator[ollama.AsyncClient]:
    client = ollama.AsyncClient(host=emulator.url)
    yield client
    await client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
async def oai(emulator: OllamaEmulator) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{emulator.url}/v1", api_key="unused",
                                  max_retries=0) as client:
        yield client


async def stats(emulator: OllamaEmulator) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{emulator.url}/emulator/stats")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


# -- Ollama: embeddings, truncate, tools, version ----------------------------------

async def test_embed_answers_deterministic_unit_vectors(
    client: ollama.AsyncClient, emulator: OllamaEmulator,
) -> None:
    first = await client.embed(model=SMALL.name, input=["alpha", "beta"])
    again = await client.embed(model=SMALL.name, input="alpha")
    assert first.model == SMALL.name and len(first.embeddings) == 2
    assert first.embeddings[0] == again.embeddings[0] != first.embeddings[1]
    assert len(first.embeddings[0]) == emulator.config.embedding_length
    assert math.isclose(math.fsum(v * v for v in first.embeddings[0]), 1.0)
    assert first.prompt_eval_count == 3  # "alpha" is 2 tokens of 4 chars, "beta" 1
    short = await client.embed(model=SMALL.name, input="alpha", dimensions=8)
    assert len(short.embeddings[0]) == 8
    assert math.isclose(math.fsum(v * v for v in short.embeddings[0]), 1.0)


async def test_legacy_embeddings_answer_one_raw_vector(
    client: ollama.AsyncClient, emulator: OllamaEmulator,
) -> None:
    legacy = await client.embeddings(model=SMALL.name, prompt="alpha")
    modern = await client.embed(model=SMALL.name, input="alpha")
    norm = math.sqrt(math.fsum(v * v for v in legacy.embedding))
    assert not math.isclose(norm, 1.0)  # Ollama's older call does not normalise
    assert all(math.isclose(a / norm, b) for a, b in zip(legacy.embedding,
                                                          modern.embeddings[0], strict=True))
    assert (await client.embeddings(model=SMALL.name, prompt="")).embedding == []


async def test_embed_cuts_an_over_long_input_unless_truncate_is_off(
    client: ollama.AsyncClient, emulator: OllamaEmulator,
) -> None:
    cut = await client.embed(model=SMALL.name, input=LONG)
    assert cut.prompt_eval_count == 1024 and emulator.records[-1].truncated
    with pytest.raises(ollama.ResponseError) as refused:
        await client.embed(model=SMALL.name, input=LONG, truncate=False)
    assert refused.value.status_code == 400
    assert refused.value.error == "the input length exceeds the context length"
    assert (await stats(emulator))["truncations"] == 1  # the refusal cut nothing


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
async def test_truncate_false_refuses_an_over_long_prompt(
    emulator: OllamaEmulator, path: str,
) -> None:
    prompt = ({"messages": [{"role": "user", "content": LONG}]} if path == "/api/chat"
              else {"prompt": LONG})
    async with httpx.AsyncClient(timeout=10) as http:
        refused = await http.post(f"{emulator.url}{path}", json={
            "model": SMALL.name, "stream": False, "truncate": False, **prompt})
        fits = await http.post(f"{emulator.url}{path}", json={
            "model": SMALL.name, "stream": False, "truncate": False,
            **({"messages": [{"role": "user", "content": "hi"}]} if path == "/api/chat"
               else {"prompt": "hi"})})
        cut = await http.post(f"{emulator.url}{path}", json={
            "model": SMALL.name, "stream": False, **prompt})
    assert refused.status_code == 400
    assert refused.json() == {"error": "the input length exceeds the context length"}
    assert fits.status_code == 200 and cut.status_code == 200
    assert [r.truncated for r in emulator.records] == [False, False, True]
    assert emulator.records[0].error is not None
    assert (await stats(emulator))["truncations"] == 1


async def test_the_official_client_gets_tool_calls(client: ollama.AsyncClient) -> None:
    reply = await client.chat(model=SMALL.name, tools=[WEATHER], messages=[
        {"role": "user", "content": "call get_weather for Paris"}])
    [call] = reply.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert call.function.arguments == {"city": "emulated"}
    streamed = [part async for part in await client.chat(
        model=SMALL.name, tools=[WEATHER], stream=True,
        messages=[{"role": "user", "content": "call get_weather for Paris"}])]
    calls = [c for part in streamed for c in part.message.tool_calls or []]
    assert [c.function.name for c in calls] == ["get_weather"]
    answered = await client.chat(model=SMALL.name, tools=[WEATHER], messages=[
        {"role": "user", "content": "call get_weather for Paris"}, reply.message,
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"}])
    assert answered.message.content and not answered.message.tool_calls


async def test_version_and_show_satisfy_clients(
    client: ollama.AsyncClient, emulator: OllamaEmulator,
) -> None:
    async with httpx.AsyncClient() as http:
        version = (await http.get(f"{emulator.url}/api/version")).json()["version"]
    major, minor, _patch = version.split("-", 1)[0].split(".")
    assert version == EMULATOR_VERSION and "emulator" in version
    assert (int(major), int(minor)) >= (0, 6)  # newer than the API Kubemoot needs
    shown = await client.show(SMALL.name)
    info = shown.modelinfo or {}
    arch = info["general.architecture"]
    assert info[f"{arch}.context_length"] == emulator.config.context_length
    assert shown.modified_at is not None and "completion" in (shown.capabilities or [])


# -- OpenAI-compatible routes ------------------------------------------------------

async def test_openai_chat_completion(oai: openai.AsyncOpenAI,
                                      emulator: OllamaEmulator) -> None:
    done = await oai.chat.completions.create(
        model=SMALL.name, messages=[{"role": "user", "content": "why?"}])
    [choice] = done.choices
    assert choice.finish_reason == "stop" and choice.message.content
    assert done.usage is not None and done.usage.completion_tokens > 0
    native = emulator.records[-1]
    assert native.path == "/v1/chat/completions" and native.model == SMALL.name
    assert done.usage.prompt_tokens == native.prompt_tokens_evaluated
    limited = await oai.chat.completions.create(
        model=SMALL.name, max_tokens=2, messages=[{"role": "user", "content": "why?"}])
    assert limited.choices[0].finish_reason == "length"
    assert limited.usage is not None and limited.usage.completion_tokens == 2


async def test_openai_streaming_with_usage(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model=SMALL.name, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "why?"}]}])
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text and finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    plain = await oai.chat.completions.create(
        model=SMALL.name, messages=[{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "why?"}])
    assert text == plain.choices[0].message.content


async def test_openai_tool_calls(oai: openai.AsyncOpenAI) -> None:
    done = await oai.chat.completions.create(
        model=SMALL.name, tools=[WEATHER],  # type: ignore[list-item]
        messages=[{"role": "user", "content": "call get_weather for Paris"}])
    [call] = done.choices[0].message.tool_calls or []
    assert done.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.function.arguments == '{"city": "emulated"}'  # type: ignore[union-attr]


async def test_openai_models_and_errors(oai: openai.AsyncOpenAI) -> None:
    listed = [m.id async for m in oai.models.list()]
    assert listed == [SMALL.name, MEDIUM.name, LARGE.name]
    assert (await oai.models.retrieve(SMALL.name)).owned_by == "library"
    with pytest.raises(openai.NotFoundError) as missing:
        await oai.chat.completions.create(
            model="missing:1b", messages=[{"role": "user", "content": "x"}])
    assert "not found" in str(missing.value)
    with pytest.raises(openai.BadRequestError):
        await oai.chat.completions.create(model=SMALL.name, messages=[])


async def test_openai_embeddings_match_ollamas(
    oai: openai.AsyncOpenAI, client: ollama.AsyncClient,
) -> None:
    base64 = await oai.embeddings.create(model=SMALL.name, input=["alpha", "beta"])
    floats = await oai.embeddings.create(model=SMALL.name, input="alpha",
                                         encoding_format="float")
    native = await client.embed(model=SMALL.name, input=["alpha", "beta"])
    assert [d.index for d in base64.data] == [0, 1]
    assert floats.data[0].embedding == native.embeddings[0]
    for got, want in zip(base64.data, native.embeddings, strict=True):  # float32 on the wire
        assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7)
                   for a, b in zip(got.embedding, want, strict=True))
    assert base64.usage.prompt_tokens == 3
    short = await oai.embeddings.create(model=SMALL.name, input="alpha", dimensions=4,
                                        encoding_format="float")
    assert len(short.data[0].embedding) == 4


# -- stats and slots ---------------------------------------------------------------

async def test_stats_count_only_evictions_the_engine_forced(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator(vram_mib=7000)
    async with httpx.AsyncClient(timeout=10) as http:
        async def generate(body: dict[str, Any]) -> None:
            response = await http.post(f"{emulator.url}/api/generate", json=body)
            assert response.status_code == 200

        await generate({"model": MEDIUM.name})  # 3000 MiB
        await generate({"model": MEDIUM.name, "keep_alive": 0})  # asked to go: not forced
        await generate({"model": SMALL.name})  # 1008 MiB
        await generate({"model": SMALL.name, "options": {"num_ctx": 2048}})  # a reload
        before = await stats(emulator)
        await generate({"model": LARGE.name})  # 6000 MiB: the engine must push small out
    after = await stats(emulator)
    assert before["evictions"] == 0 and before["reloads"] == 1
    assert after["evictions"] == 1 and after["evictionsByModel"] == {SMALL.name: 1}
    assert after["loads"] == 4 and after["loadsByModel"][SMALL.name] == 2
    assert after["peakVramMiB"] == 6000 and after["usedVramMiB"] == 6000
    assert after["vramMiB"] == 7000


@pytest.mark.parametrize(("path", "first_chunk"), [
    ("/api/chat", '"done": false'),  # NDJSON
    ("/v1/chat/completions", '"chat.completion.chunk"'),  # server-sent events
])
async def test_a_client_that_leaves_mid_stream_frees_its_slot(
    make_emulator: Callable[..., OllamaEmulator], path: str, first_chunk: str,
) -> None:
    emulator = make_emulator(per_token_s=100_000.0)  # 1000 s of real time per word
    body = {"model": SMALL.name, "messages": [{"role": "user", "content": "hi"}],
            "stream": True}
    async with httpx.AsyncClient(timeout=10) as http:
        async with http.stream("POST", f"{emulator.url}{path}", json=body) as reply:
            async for line in reply.aiter_lines():
                assert first_chunk in line
                break  # the first word arrived; the rest would take hours
            copy = emulator.engine.card.copies[SMALL.name]
            assert copy.active == 1  # still streaming: the slot is taken

        # the server notices the hang-up and gives the slot back
        await emulator.until(lambda _: copy.active == 0)
    assert (await stats(emulator))["waiting"] == 0


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
async def test_a_client_that_leaves_a_whole_answer_frees_its_slot(
    make_emulator: Callable[..., OllamaEmulator], path: str,
) -> None:
    emulator = make_emulator(per_token_s=100_000.0)  # the answer would take hours
    body = {"model": SMALL.name, "messages": [{"role": "user", "content": "hi"}],
            "stream": False}
    async with httpx.AsyncClient(timeout=None) as http:
        asking = asyncio.create_task(http.post(f"{emulator.url}{path}", json=body))

        await emulator.until(lambda engine: SMALL.name in engine.peak_busy)
        asking.cancel()  # the client hangs up mid-answer
        with pytest.raises(asyncio.CancelledError):
            await asking
    copy = emulator.engine.card.copies[SMALL.name]
    # the server notices and cancels the generation, as Ollama does
    await emulator.until(lambda _: copy.active == 0)
