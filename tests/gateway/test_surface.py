"""The rest of the surface (issue 22 item 10), through the official clients.

Legacy ``/v1/completions`` (streamed too) and Ollama's ``suffix`` reach the engine;
``n > 1`` is refused rather than answered with one choice; ``encoding_format: base64``
is honoured; Ollama's duration strings are read; ``/api/tags`` says which servers hold
each model and ``/v1/models`` dates each model by its modified time.
"""

from __future__ import annotations

import base64
import struct
from datetime import UTC, datetime

import httpx
import ollama
import openai
import pytest

from tests.gateway.conftest import Fleet, live_tickets


@pytest.fixture
def client(fleet: Fleet) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=fleet.url)


@pytest.fixture
def oai(fleet: Fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0)


def _recorded(fleet: Fleet, path: str) -> list[list[dict[str, object]]]:
    return [r.messages for e in fleet.emulators.values() for r in e.records if r.path == path]


async def test_legacy_completions_carry_the_suffix_to_the_engine(
        oai: openai.AsyncOpenAI, fleet: Fleet) -> None:
    done = await oai.completions.create(model="small:1b", prompt="def add(a, b):",
                                        suffix="    return total", max_tokens=16)
    assert done.object == "text_completion" and done.model == "small:1b"
    assert len(done.choices) == 1 and "small:1b" in done.choices[0].text
    assert done.choices[0].finish_reason in ("stop", "length")
    assert done.usage is not None and done.usage.prompt_tokens > 0
    assert _recorded(fleet, "/api/generate") == [[
        {"role": "user", "content": "def add(a, b):"},
        {"role": "suffix", "content": "    return total"}]]

    stream = await oai.completions.create(model="small:1b", prompt="hello", stream=True,
                                          stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert "small:1b" in "".join(c.choices[0].text for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    await fleet.finished.until(2)
    assert await live_tickets(fleet.gateway) == []


async def test_legacy_completions_echo_the_prompt(oai: openai.AsyncOpenAI) -> None:
    done = await oai.completions.create(model="small:1b", prompt="Once upon", echo=True)
    assert done.choices[0].text.startswith("Once upon")
    assert len(done.choices[0].text) > len("Once upon")


async def test_ollama_generate_forwards_the_suffix(client: ollama.AsyncClient,
                                                   fleet: Fleet) -> None:
    reply = await client.generate(model="small:1b", prompt="<body>", suffix="</body>")
    assert reply.response
    assert _recorded(fleet, "/api/generate") == [[
        {"role": "user", "content": "<body>"}, {"role": "suffix", "content": "</body>"}]]


@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_more_than_one_choice_is_refused_not_answered_with_one(
        oai: openai.AsyncOpenAI, fleet: Fleet, route: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        if route == "chat":
            await oai.chat.completions.create(
                model="small:1b", n=2, messages=[{"role": "user", "content": "hi"}])
        else:
            await oai.completions.create(model="small:1b", n=3, prompt="hi")
    assert refused.value.code == "unsupported_value"
    assert "one choice per call" in str(refused.value)
    assert _recorded(fleet, "/api/chat") == _recorded(fleet, "/api/generate") == []


async def test_a_prompt_list_of_several_is_refused(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="one prompt per call"):
        await oai.completions.create(model="small:1b", prompt=["one", "two"])


async def test_base64_embeddings_decode_to_the_float_ones(
        oai: openai.AsyncOpenAI, fleet: Fleet) -> None:
    # the openai client asks for base64 unless told otherwise, and decodes it itself
    decoded = await oai.embeddings.create(model="small:1b", input="one")
    floats = await oai.embeddings.create(model="small:1b", input="one",
                                         encoding_format="float")
    assert decoded.data[0].embedding == pytest.approx(floats.data[0].embedding, rel=1e-6)
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        raw = await http.post("/v1/embeddings", json={
            "model": "small:1b", "input": "one", "encoding_format": "base64"})
        bad = await http.post("/v1/embeddings", json={
            "model": "small:1b", "input": "one", "encoding_format": "hex"})
    packed = base64.b64decode(raw.json()["data"][0]["embedding"])
    vector = struct.unpack(f"<{len(packed) // 4}f", packed)
    assert list(vector) == pytest.approx(floats.data[0].embedding, rel=1e-6)
    assert bad.status_code == 400 and "encoding_format" in bad.json()["error"]["message"]


@pytest.mark.parametrize("keep_alive", ["1h30m", "-1", 90, "2m30s"])
async def test_keep_alive_durations_ollama_accepts(client: ollama.AsyncClient,
                                                   keep_alive: str | int) -> None:
    reply = await client.generate(model="small:1b", prompt="hi", keep_alive=keep_alive)
    assert reply.done


async def test_a_keep_alive_that_is_no_duration_is_a_400(client: ollama.AsyncClient) -> None:
    with pytest.raises(ollama.ResponseError) as refused:
        await client.generate(model="small:1b", prompt="hi", keep_alive="1h30")
    assert refused.value.status_code == 400 and "keep_alive" in refused.value.error


async def test_tags_name_the_servers_and_models_their_modified_time(
        fleet: Fleet, oai: openai.AsyncOpenAI) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        tags = (await http.get("/api/tags")).json()["models"]
    # both emulators hold every model of the card
    assert {e["name"]: e["providers"] for e in tags} == {
        name: ["gpu-a", "gpu-b"]
        for name in ("huge:70b", "medium:7b", "plain:latest", "small:1b")}
    modified = {e["name"]: e["modified_at"] for e in tags}
    models = {m.id: m.created async for m in oai.models.list()}
    for name, stamp in modified.items():
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC)
        assert models[name] == int(when.timestamp()) > 0
    # one model, asked for by itself, carries the same date as its list entry
    for name in ("small:1b", "plain"):
        one = await oai.models.retrieve(name)
        assert one.id == name and one.created == models[name if ":" in name else f"{name}:latest"]
