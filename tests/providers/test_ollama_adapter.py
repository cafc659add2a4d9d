"""The Ollama adapter against the emulator, over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from kubemoot.clock import ManualClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider, parse_endpoint
from kubemoot.providers.protocol import (
    ChatResult,
    ModelNotFound,
    ProviderBadResponse,
    ProviderClient,
    ProviderError,
    ProviderTimeout,
)
from tests.providers.conftest import LARGE, MEDIUM, SMALL

MIB = 1024 * 1024


@pytest.fixture
async def client(emulator: OllamaEmulator) -> AsyncIterator[OllamaProvider]:
    async with OllamaProvider("emu", emulator.url, context_length=1024, num_parallel=1,
                              total_vram_mib=8192, timeout=5, clock=ManualClock(100.0),
                              retry_delay=0) as provider:
        yield provider


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_adapter_satisfies_the_protocol(client: OllamaProvider) -> None:
    assert isinstance(client, ProviderClient)


async def test_probe_of_an_idle_engine(client: OllamaProvider) -> None:
    state = await client.probe()
    assert state.ready and state.reason is None
    assert state.provider == "emu" and state.endpoint == client.endpoint
    assert state.last_probed_at == 100.0  # from the injected clock
    assert (state.total_vram_mib, state.max_parallel, state.context_length) == (8192, 1, 1024)
    assert state.loaded_models == []
    assert state.disk_sizes_mib == {"small:1b": 1000, "medium:7b": 3000, "large:30b": 6000}


async def test_total_vram_is_unknown_without_dcgm_or_spec(emulator: OllamaEmulator) -> None:
    async with OllamaProvider("emu", emulator.url) as provider:
        state = await provider.probe()
    assert state.total_vram_mib is None and state.context_length is None


async def test_preload_shows_footprint_and_context_then_unload(
    client: OllamaProvider,
) -> None:
    await client.preload(SMALL.name)
    state = await client.probe()
    [loaded] = state.loaded_models
    # KV slab: 8 MiB per 1k tokens of num_ctx 1024 × 1 slot, on top of 1000 MiB weights
    assert (loaded.name, loaded.size_mib, loaded.context_length) == (SMALL.name, 1008, 1024)
    assert loaded.digest == SMALL.manifest_digest
    assert loaded.expires_at is not None
    assert state.loaded_model_footprints == {SMALL.name: 1008}
    assert state.used_vram_mib == 1008
    await client.unload(SMALL.name)
    assert (await client.probe()).loaded_models == []


async def test_preload_with_a_larger_context_reserves_a_larger_slab(
    client: OllamaProvider,
) -> None:
    await client.preload(SMALL.name, num_ctx=4096)
    [loaded] = (await client.probe()).loaded_models
    assert (loaded.size_mib, loaded.context_length) == (1032, 4096)


async def test_load_time_follows_the_load_rate(client: OllamaProvider,
                                               emulator: OllamaEmulator) -> None:
    result = await client.chat(MEDIUM.name, [user("hi")])
    assert result.content
    # the emulator reports the emulated load time: 3000 MiB at 1000 MiB/s
    import httpx

    async with httpx.AsyncClient() as http:
        first = (await http.post(f"{emulator.url}/api/generate",
                                 json={"model": LARGE.name, "stream": False})).json()
        again = (await http.post(f"{emulator.url}/api/generate",
                                 json={"model": LARGE.name, "stream": False})).json()
    assert first["done_reason"] == "load" and first["load_duration"] == 6 * 10**9
    assert again["load_duration"] == 0  # already resident


async def test_chat_sends_num_ctx_and_reports_engine_counts(
    client: OllamaProvider, emulator: OllamaEmulator,
) -> None:
    result = await client.chat(SMALL.name, [user("What fits on this card?")], num_ctx=2048,
                               options={"temperature": 0})
    assert isinstance(result, ChatResult)
    assert result.model == SMALL.name and result.done_reason == "stop"
    assert result.content.startswith(f"[{SMALL.name}, emulated]")
    assert result.eval_count and result.eval_count > 0
    [record] = emulator.records
    assert (record.num_ctx, record.context_length, record.truncated) == (2048, 2048, False)
    assert result.prompt_eval_count == record.prompt_tokens_evaluated == record.prompt_tokens
    again = await client.chat(SMALL.name, [user("What fits on this card?")], num_ctx=2048)
    assert again.content == result.content  # deterministic


async def test_an_over_long_prompt_is_cut_silently_and_recorded(
    client: OllamaProvider, emulator: OllamaEmulator,
) -> None:
    question = user("The question that matters: " + "detail " * 700)  # ≈ 1230 tokens
    history = [{"role": "system", "content": "be brief"}, user("old " * 200),
               {"role": "assistant", "content": "ok " * 100}, question]
    result = await client.chat(SMALL.name, history, num_ctx=1024)
    [record] = emulator.records
    assert record.truncated and record.prompt_tokens > 1024
    assert record.dropped_messages == 2  # the oldest user and assistant turns
    assert result.prompt_eval_count == record.prompt_tokens_evaluated == 1024
    assert record.messages == history  # what was received, before the cut


async def test_tool_calls_come_back_when_the_question_names_a_tool(
    client: OllamaProvider,
) -> None:
    tools = [{"type": "function", "function": {
        "name": "kubectl_get", "description": "read a resource",
        "parameters": {"type": "object", "properties": {"kind": {"type": "string"}},
                       "required": ["kind"]}}}]
    result = await client.chat(SMALL.name, [user("please use kubectl_get")], tools=tools)
    assert result.tool_calls == [
        {"function": {"name": "kubectl_get", "arguments": {"kind": "emulated"}}}
    ]
    plain = await client.chat(SMALL.name, [user("no tools needed")], tools=tools)
    assert plain.tool_calls == [] and plain.content


async def test_unknown_model_is_model_not_found(client: OllamaProvider) -> None:
    with pytest.raises(ModelNotFound, match="nope:1b"):
        await client.chat("nope:1b", [user("hi")])
    with pytest.raises(ModelNotFound):
        await client.preload("nope:1b")


async def test_parallel_slots_with_a_fifo_queue_behind_them(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator(num_parallel=2, base_latency_s=20.0)  # 0.2 s real per call
    async with OllamaProvider("emu", emulator.url, timeout=10) as provider:
        await provider.preload(SMALL.name)
        results = await asyncio.gather(*(
            provider.chat(SMALL.name, [user(f"question {i}")]) for i in range(5)
        ))
    assert len(results) == 5
    assert emulator.engine.peak_busy[SMALL.name] == 2  # never more than the slots
    queued = [r.queued for r in emulator.records]
    assert queued.count(True) == 3 and queued.count(False) == 2
    assert emulator.engine.loads == [SMALL.name]  # queued calls shared the one copy


async def test_a_model_that_does_not_fit_evicts_the_idle_one_expiring_first(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator(vram_mib=10000)
    async with OllamaProvider("emu", emulator.url) as client:
        await client.preload(MEDIUM.name, keep_alive=600)  # 3000 MiB, expires later
        await client.preload(SMALL.name, keep_alive=60)  # 1008 MiB, expires sooner
        await client.preload(LARGE.name)  # 6000 MiB: 5992 free, one must go
        names = {m.name for m in (await client.probe()).loaded_models}
    assert names == {MEDIUM.name, LARGE.name}
    assert emulator.engine.evictions == [SMALL.name]


async def test_a_model_larger_than_the_card_is_refused(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator(vram_mib=2048)
    async with OllamaProvider("emu", emulator.url) as provider:
        with pytest.raises(ProviderBadResponse, match="needs 3000 MiB"):
            await provider.preload(MEDIUM.name)


async def test_a_5xx_is_not_retried(client: OllamaProvider, emulator: OllamaEmulator) -> None:
    emulator.fail_next(500, path="/api/chat")  # a retry would have succeeded
    with pytest.raises(ProviderBadResponse, match="HTTP 500"):
        await client.chat(SMALL.name, [user("hi")])


async def test_a_4xx_is_not_retried(client: OllamaProvider, emulator: OllamaEmulator) -> None:
    emulator.fail_next(404, path="/api/ps")
    # Ollama always serves /api/ps: a 404 there means the URL is not an Ollama API
    with pytest.raises(ProviderBadResponse,
                       match="HTTP 404 from GET /api/ps: not an Ollama API endpoint"):
        await client.probe()
    emulator.fail_next(400, path="/api/ps")
    with pytest.raises(ProviderError, match="HTTP 400") as caught:
        await client.probe()
    assert not isinstance(caught.value, ProviderBadResponse)


@pytest.mark.parametrize("retries", [0, 1])
async def test_a_timeout_is_never_retried(emulator: OllamaEmulator, retries: int) -> None:
    # a retry would have succeeded: only the first request stalls
    emulator.stall_next(0.5, count=1, path="/api/ps")
    async with OllamaProvider("emu", emulator.url, timeout=0.2, max_retries=retries,
                              retry_delay=0) as provider:
        with pytest.raises(ProviderTimeout, match=r"no answer within 0\.2 s"):
            await provider.probe()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://gpu-a:11434", ("gpu-a:11434", "http://gpu-a:11434")),
        ("gpu-a=http://10.0.0.5:11434/", ("gpu-a", "http://10.0.0.5:11434")),
        ("10.0.0.5", ("10.0.0.5:11434", "http://10.0.0.5:11434")),
        ("b=https://ollama.example", ("b", "https://ollama.example:443")),
        ("c=http://[::1]:8080", ("c", "http://[::1]:8080")),
    ],
)
def test_parse_endpoint(text: str, expected: tuple[str, str]) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize("text", ["ftp://host", "http://", "http://host:99999",
                                  "http://host:port", "x=http://[bad", "http://a b"])
def test_parse_endpoint_rejects_malformed(text: str) -> None:
    from kubemoot.api.errors import InputError

    with pytest.raises(InputError):
        parse_endpoint(text)
