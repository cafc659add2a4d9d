"""The official ``ollama`` and ``openai`` clients against a real gateway and emulators."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import ollama
import openai
import pytest

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.testing.waiting import until_stored
from tests.gateway.conftest import Fleet, finished_calls, live_tickets, start_gateway

HELLO = [{"role": "user", "content": "hello there"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture
def client(fleet: Fleet) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=fleet.url)


@pytest.fixture
def oai(fleet: Fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0)


async def test_list_merges_complete_entries(client: ollama.AsyncClient) -> None:
    listed = await client.list()
    names = [m.model for m in listed.models]
    assert names == sorted({"small:1b", "medium:7b", "plain:latest", "huge:70b"})
    for entry in listed.models:
        assert entry.digest and entry.size and entry.modified_at is not None
        assert entry.details is not None and entry.details.family


async def test_show_is_forwarded_to_a_provider_that_has_the_model(
        client: ollama.AsyncClient) -> None:
    shown = await client.show("small:1b")
    assert shown.details is not None and shown.details.family == "small"
    with pytest.raises(ollama.ResponseError) as error:
        await client.show("nothing:here")
    assert error.value.status_code == 404


async def test_chat_non_streaming_and_streaming(client: ollama.AsyncClient,
                                                fleet: Fleet) -> None:
    reply = await client.chat(model="small:1b", messages=HELLO)
    assert reply.done and "small:1b" in (reply.message.content or "")
    parts = [p async for p in await client.chat(model="small:1b", messages=HELLO,
                                                 stream=True)]
    assert parts[-1].done and "small:1b" in "".join(p.message.content or "" for p in parts)
    await fleet.finished.until(2)
    assert await fleet.tickets_left() == []
    assert fleet.gateway.desk is not None and not fleet.gateway.desk.in_flight


async def test_generate_resolves_a_name_without_tag_to_latest(
        client: ollama.AsyncClient) -> None:
    reply = await client.generate(model="plain", prompt="hello")
    assert reply.model == "plain:latest" and reply.response


async def test_every_inference_reply_carries_the_decision_headers(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        first = await http.post("/api/chat", json={"model": "medium:7b", "messages": HELLO,
                                                  "stream": False})
        second = await http.post("/api/chat", json={"model": "medium:7b",
                                                   "messages": HELLO, "stream": False})
    assert first.status_code == second.status_code == 200
    assert first.headers["x-kubemoot-action"] == "cold-load"
    assert second.headers["x-kubemoot-action"] == "warm"
    assert second.headers["x-kubemoot-provider"] == first.headers["x-kubemoot-provider"]
    assert second.headers["x-kubemoot-model"] == "medium:7b"
    assert float(second.headers["x-kubemoot-wait-seconds"]) >= 0


async def test_load_request_then_keep_alive_zero_unloads(client: ollama.AsyncClient,
                                                        fleet: Fleet) -> None:
    loaded = await client.generate(model="medium:7b", prompt="")
    assert loaded.done_reason == "load"
    assert [m.model for m in (await client.ps()).models] == ["medium:7b"]
    gone = await client.generate(model="medium:7b", prompt="", keep_alive=0)
    assert gone.done_reason == "unload"
    assert (await client.ps()).models == []


async def test_ps_is_fleet_wide_and_names_the_provider(fleet: Fleet,
                                                        client: ollama.AsyncClient) -> None:
    await client.generate(model="small:1b", prompt="hi")
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        models = (await http.get("/api/ps")).json()["models"]
    assert [(m["name"], m["provider"] in fleet.emulators) for m in models] == [
        ("small:1b", True)]


async def test_tool_calls_pass_through_both_apis(client: ollama.AsyncClient,
                                                 oai: openai.AsyncOpenAI) -> None:
    ask = [{"role": "user", "content": "call get_weather for Paris"}]
    reply = await client.chat(model="small:1b", messages=ask, tools=[WEATHER_TOOL])
    calls = reply.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]
    completion = await oai.chat.completions.create(
        model="small:1b", messages=ask, tools=[WEATHER_TOOL])  # type: ignore[list-item]
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    function = choice.message.tool_calls[0].function  # type: ignore[union-attr]
    assert function.name == "get_weather"
    assert json.loads(function.arguments) == {"city": "emulated"}
    # the tool's answer goes back through the gateway as OpenAI messages
    follow = await oai.chat.completions.create(model="small:1b", messages=[
        *ask, choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id,
         "content": "sunny"}], tools=[WEATHER_TOOL])  # type: ignore[list-item]
    assert follow.choices[0].finish_reason == "stop" and follow.choices[0].message.content


async def test_openai_models_chat_and_streaming_usage(oai: openai.AsyncOpenAI) -> None:
    ids = [m.id async for m in oai.models.list()]
    assert "small:1b" in ids
    completion = await oai.chat.completions.create(model="small:1b", messages=HELLO)  # type: ignore[arg-type]
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    stream = await oai.chat.completions.create(
        model="small:1b", messages=HELLO, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "small:1b" in text
    assert chunks[-1].usage is not None and chunks[-1].choices == []


async def test_openai_errors_have_openai_codes(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await oai.chat.completions.create(model="nope:1b", messages=HELLO)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as too_long:
        await oai.chat.completions.create(model="small:1b", messages=long)  # type: ignore[arg-type]
    assert too_long.value.code == "context_length_exceeded"
    assert "1024 tokens" in str(too_long.value)


async def test_ollama_refusals_say_why(client: ollama.AsyncClient, fleet: Fleet) -> None:
    with pytest.raises(ollama.ResponseError) as missing:
        await client.chat(model="nope:1b", messages=HELLO)
    assert missing.value.status_code == 404
    assert missing.value.error == 'model "nope:1b" not found, try pulling it first'
    with pytest.raises(ollama.ResponseError) as huge:
        await client.chat(model="huge:70b", messages=HELLO)
    assert huge.value.status_code == 400 and "larger than the usable memory" in huge.value.error
    with pytest.raises(ollama.ResponseError) as long:
        await client.chat(model="small:1b",
                          messages=[{"role": "user", "content": "word " * 5000}])
    assert long.value.status_code == 400 and "1024 tokens" in long.value.error
    assert all(not r.truncated for e in fleet.emulators.values() for r in e.records)


async def test_num_ctx_smaller_than_the_prompt_is_refused_not_cut(
        client: ollama.AsyncClient, fleet: Fleet) -> None:
    with pytest.raises(ollama.ResponseError) as error:
        await client.chat(model="small:1b", messages=[{"role": "user", "content": "w " * 400}],
                          options={"num_ctx": 64})
    assert error.value.status_code == 400 and "options.num_ctx" in error.value.error
    assert [r for e in fleet.emulators.values() for r in e.records] == []


async def test_busy_gpus_answer_503_with_retry_after_and_leaving_releases(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    """Both slots of the only copy that fits are held by streams the clients then drop:
    a third call with no wait budget is refused 503; dropping the streams frees every
    ticket (the upstream requests are cancelled with them)."""
    emulator = make_emulator()
    gateway = await start_gateway({"gpu-a": emulator})
    assert gateway.desk is not None and gateway.stack is not None
    desk = gateway.desk
    finished = finished_calls(gateway)
    emulator.stall_next(60.0, count=2, path="/api/chat")
    body = {"model": "medium:7b", "messages": HELLO, "stream": True}
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            held = [asyncio.create_task(http.post("/api/chat", json=body)) for _ in range(2)]

            async def both_held() -> bool:
                return len(await live_tickets(gateway)) == 2

            await until_stored(gateway.stack.tickets_bucket, both_held, timeout=30,
                               what="both streams holding a ticket")
            busy = await http.post("/api/chat", json=body,
                                   headers={"X-Kubemoot-Wait-Budget": "0"})
            assert busy.status_code == 503
            assert int(busy.headers["retry-after"]) >= 1
            assert "busy" in busy.json()["error"]
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
        await finished.until(2)
        assert not desk.in_flight
        assert await live_tickets(gateway) == []
    finally:
        await gateway.stop()

async def test_embeddings_through_both_apis(client: ollama.AsyncClient,
                                            oai: openai.AsyncOpenAI, fleet: Fleet) -> None:
    embedded = await client.embed(model="small:1b", input=["one", "two"])
    assert len(embedded.embeddings) == 2 and embedded.embeddings[0]
    legacy = await client.embeddings(model="small:1b", prompt="one")
    # Ollama's legacy route answers an unnormalised vector of the same length
    assert len(legacy.embedding) == len(embedded.embeddings[0])
    vectors = await oai.embeddings.create(model="small:1b", input=["one", "two"])
    assert [d.index for d in vectors.data] == [0, 1]
    assert vectors.data[0].embedding == pytest.approx(list(embedded.embeddings[0]))
    await fleet.finished.until(3)
    # each of the three calls held a ticket of its own, and gave it back
    assert [r.ok for r in fleet.finished.records] == [True, True, True]
    assert await fleet.tickets_left() == []


async def test_every_call_is_attributed_to_its_caller(keyed: Fleet) -> None:
    client = ollama.AsyncClient(host=keyed.url,
                                headers={"Authorization": "Bearer sk-alice-secret"})
    await client.chat(model="small:1b", messages=HELLO)
    await keyed.finished.until(1)
    [record] = keyed.finished.records
    assert (record.agent, record.model, record.provider, record.phase, record.ok) == (
        "alice", "small:1b", "gpu-a", "chat", True)
    assert record.action == "cold-load" and record.waited_seconds >= 0


async def test_a_prompt_the_engine_finds_too_long_is_a_400_never_cut(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    """The gateway's estimate under-counts for this engine (one character a token): the
    engine, told never to truncate, refuses, and the client gets the honest 400."""
    emulators = {"gpu-a": make_emulator(chars_per_token=1.0)}
    gateway = await start_gateway(emulators)
    try:
        client = ollama.AsyncClient(host=gateway.url)
        with pytest.raises(ollama.ResponseError) as error:
            await client.chat(model="small:1b",
                              messages=[{"role": "user", "content": "word " * 400}])
        assert error.value.status_code == 400 and "context" in error.value.error
        stats = emulators["gpu-a"].stats()
        assert stats["truncations"] == 0
        assert gateway.desk is not None and not gateway.desk.in_flight
    finally:
        await gateway.stop()


async def test_a_provider_that_misses_a_probe_keeps_its_models_known(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    """While its only provider cannot be probed, a model it listed is busy (503), not
    unknown (404); a name nobody ever listed is still 404."""
    emulator = make_emulator()
    gateway = await start_gateway({"gpu-a": emulator})
    assert gateway.prober is not None and gateway.stack is not None
    try:
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            body = {"model": "small:1b", "messages": HELLO, "stream": False}
            assert (await http.post("/api/chat", json=body)).status_code == 200
            emulator.fail_next(500, count=1000, path="/api/ps")
            state = await gateway.prober.probe_one(gateway.clients["gpu-a"])
            assert not state.ready
            view = gateway.stack.view

            async def not_ready() -> bool:
                fleet = await view.snapshot()
                return all(not p.state.ready for p in fleet.providers)

            view.invalidate("gpu-a")  # read the state the probe just published, not a cache
            assert await not_ready()
            busy = await http.post("/api/chat", json=body,
                                   headers={"X-Kubemoot-Wait-Budget": "0"})
            assert busy.status_code == 503, busy.text
            missing = await http.post("/api/chat", json={**body, "model": "never:1b"})
            assert missing.status_code == 404
    finally:
        await gateway.stop()


async def test_engine_options_num_ctx_and_keep_alive(client: ollama.AsyncClient,
                                                     fleet: Fleet) -> None:
    """A warm copy whose context holds the prompt runs as loaded (a different num_ctx
    would reload it); a keep_alive of "forever" is capped at --max-keep-alive."""
    await client.chat(model="small:1b", messages=HELLO)
    reply = await client.chat(model="small:1b", messages=HELLO,
                              options={"num_ctx": 512}, keep_alive=-1)
    assert reply.done
    records = [r for e in fleet.emulators.values() for r in e.records]
    assert [r.num_ctx for r in records] == [None, None]
    cap = fleet.gateway.settings.max_keep_alive_seconds
    async with httpx.AsyncClient() as http:
        for emulator in fleet.emulators.values():
            for entry in (await http.get(f"{emulator.url}/api/ps")).json()["models"]:
                expires = datetime.fromisoformat(entry["expires_at"].replace("Z", "+00:00"))
                assert expires <= datetime.now(UTC) + timedelta(seconds=cap + 5)


async def test_an_engine_refusal_names_the_context_or_says_it_is_unknown(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    """A provider given without contextLength: the gateway cannot refuse before loading,
    the engine refuses, and the message says how to tell the gateway the context (it used
    to print ``context of gpu-a: None``). Once the copy is loaded its context is known and
    the second refusal names it."""
    from kubemoot.clock import SystemClock
    from kubemoot.gateway import GatewayServer, ProviderSource
    from kubemoot.settings import GatewaySettings
    from kubemoot.store.memory import MemoryKV

    emulator = make_emulator(chars_per_token=1.0)
    gateway = GatewayServer(
        MemoryKV(SystemClock()), port=0, settings=GatewaySettings(wait_limit_seconds=5.0),
        providers=[ProviderSource("gpu-a", emulator.url, total_vram_mib=8192)])
    await gateway.start()
    try:
        client = ollama.AsyncClient(host=gateway.url)
        long = [{"role": "user", "content": "word " * 400}]
        with pytest.raises(ollama.ResponseError) as unknown:
            await client.chat(model="small:1b", messages=long)
        assert unknown.value.status_code == 400
        assert "None" not in unknown.value.error
        assert "provider gpu-a has no known context length" in unknown.value.error
        assert "contextLength" in unknown.value.error
        await client.chat(model="small:1b", messages=HELLO)  # loads the copy
        with pytest.raises(ollama.ResponseError) as known:
            await client.chat(model="small:1b", messages=long)
        assert known.value.status_code == 400
        assert "context of small:1b on gpu-a: 1024 tokens" in known.value.error
    finally:
        await gateway.stop()
