"""The tool loop against a real emulator over HTTP: context guard and failure caps."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from kubemoot.agent.pool import CallSettings, ChatPool
from kubemoot.agent.signals import FailureType
from kubemoot.agent.tokens import TokenEstimator
from kubemoot.agent.toolloop import Tool, ToolLoopLimits, run_tool_loop
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.protocol import ProviderClient

Messages = Sequence[Mapping[str, Any]]


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


async def _fails(arguments: Mapping[str, Any]) -> str:
    raise ConnectionError("tool server down")


async def _works(arguments: Mapping[str, Any]) -> str:
    return "3 pods running"


def _always_call(*names: str) -> Callable[[str, Messages, Messages], list[dict[str, Any]]]:
    """An engine that asks for a tool on every turn, cycling through ``names``."""

    def rule(model: str, messages: Messages, tools: Messages) -> list[dict[str, Any]]:
        turn = sum(1 for m in messages if m.get("role") == "tool")
        return [{"function": {"name": names[turn % len(names)], "arguments": {}}}]

    return rule


async def test_prompt_over_the_context_is_never_sent(
    make_emulator: Callable[..., OllamaEmulator], pool: ChatPool
) -> None:
    emulator = make_emulator(context_length=256)
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")
    # 2000 characters ≈ 572 tokens at 3.5 per token: twice the context
    result = await run_tool_loop(
        chat, _ask("why? " * 400), context_length=256, estimator=TokenEstimator()
    )
    assert result.failure is not None
    assert result.failure.failure_type is FailureType.CONTEXT_EXCEEDED
    assert result.model_calls == 0
    assert emulator.records == []  # the engine never saw it, so it could not cut it


async def test_prompt_that_fits_is_sent_whole(
    make_emulator: Callable[..., OllamaEmulator], pool: ChatPool
) -> None:
    emulator = make_emulator(context_length=1024)
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")
    estimator = TokenEstimator()
    result = await run_tool_loop(
        chat, _ask("why? " * 100), context_length=1024, estimator=estimator
    )
    assert result.ok and result.content
    (record,) = emulator.records
    assert not record.truncated and record.num_ctx == 1024
    # the engine's report taught the estimator (the emulator counts 4 chars a token)
    assert estimator.observations == 1
    assert estimator.chars_per_token > 3.5


async def test_a_large_tool_result_stops_the_loop_before_the_engine_would_cut(
    make_emulator: Callable[..., OllamaEmulator], pool: ChatPool
) -> None:
    emulator = make_emulator(context_length=512)
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")

    async def dump_logs(arguments: Mapping[str, Any]) -> str:
        return "log line\n" * 400  # 3600 characters: far past the context

    tool = Tool("dump_logs", "print the logs", dump_logs)
    result = await run_tool_loop(
        chat, _ask("please run dump_logs"), context_length=512, estimator=TokenEstimator(),
        tools=[tool],
    )
    assert result.failure is not None
    assert result.failure.failure_type is FailureType.CONTEXT_EXCEEDED
    assert result.model_calls == 1 and result.tool_calls == 1
    assert len(emulator.records) == 1 and not emulator.records[0].truncated


@pytest.mark.parametrize(
    "tools",
    [(), (Tool("kubectl_get", "list pods", _works),)],
    ids=["answer-in-words", "tool-call"],
)
async def test_a_prompt_the_engine_cut_is_a_failure_not_an_answer(
    make_emulator: Callable[..., OllamaEmulator], pool: ChatPool, tools: tuple[Tool, ...]
) -> None:
    # JSON-like text runs at 2 characters a token on this engine, so 3000 characters
    # pass the guard's 3.5-per-token estimate (~860 tokens) yet are 1500 real tokens:
    # the engine silently keeps the newest 1000 and answers from what is left.
    emulator = make_emulator(context_length=1000, chars_per_token=2.0)
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")
    estimator = TokenEstimator()
    text = ("run kubectl_get " + '{"a":1}' * 430)[:3000]
    result = await run_tool_loop(
        chat, _ask(text), context_length=1000, estimator=estimator, tools=tools
    )
    (record,) = emulator.records
    assert record.truncated and record.prompt_tokens_evaluated == 1000  # it was sent and cut
    assert result.failure is not None
    assert result.failure.failure_type is FailureType.CONTEXT_EXCEEDED
    assert "cut the prompt at 1000 tokens" in result.failure.last_error
    assert result.content == ""  # the reply to the cut prompt is not the answer
    assert result.model_calls == 1 and result.tool_calls == 0
    assert [m["role"] for m in result.messages] == ["system", "user"]
    # the cut report only tightens the ratio, so the next estimate is more cautious
    assert estimator.chars_per_token < 3.5
    assert estimator.observations == 0


async def test_the_guard_counts_from_the_engine_report_after_the_first_call(
    make_emulator: Callable[..., OllamaEmulator], pool: ChatPool
) -> None:
    emulator = make_emulator(context_length=4096)
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")
    tool = Tool("kubectl_get", "list pods", _works)
    result = await run_tool_loop(
        chat, _ask("run kubectl_get"), context_length=4096, estimator=TokenEstimator(),
        tools=[tool],
    )
    assert result.ok
    assert result.model_calls == 2  # a tool call, then the answer in words
    first, second = emulator.records
    assert second.prompt_tokens > first.prompt_tokens
    assert result.last_prompt_tokens == second.prompt_tokens_evaluated


@pytest.mark.parametrize(
    ("names", "expected_calls", "failed_tool"),
    [
        (("flaky",), 2, "flaky"),  # the same tool fails twice
        (("a", "b", "c", "d"), 4, "d"),  # four different tools, once each
        (("a", "b", "a"), 3, "a"),  # the second failure of "a" trips first
    ],
    ids=["same-tool-cap", "total-cap", "same-tool-before-total"],
)
async def test_tool_failure_caps(
    make_emulator: Callable[..., OllamaEmulator],
    pool: ChatPool,
    names: tuple[str, ...],
    expected_calls: int,
    failed_tool: str,
) -> None:
    emulator = make_emulator(tool_rule=_always_call(*names), context_length=8192)
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")
    tools = [Tool(name, f"the {name} tool", _fails) for name in sorted(set(names))]
    result = await run_tool_loop(
        chat, _ask("go"), context_length=8192, estimator=TokenEstimator(), tools=tools
    )
    assert result.failure is not None
    assert result.failure.failure_type is FailureType.TOOL_FAILURES
    assert result.failure.failed_tool == failed_tool
    assert "tool server down" in result.failure.last_error
    assert result.model_calls == expected_calls == len(emulator.records)


async def test_one_failure_does_not_stop_the_loop(
    make_emulator: Callable[..., OllamaEmulator], pool: ChatPool
) -> None:
    emulator = make_emulator(tool_rule=_always_call("flaky", "ok"), context_length=8192)
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")
    tools = [Tool("flaky", "fails", _fails), Tool("ok", "works", _works)]
    limits = ToolLoopLimits(max_iterations=3)
    result = await run_tool_loop(
        chat, _ask("go"), context_length=8192, estimator=TokenEstimator(), tools=tools,
        limits=limits,
    )
    # flaky fails (1), ok works, flaky fails (2) → the same-tool cap, not an early stop
    assert result.failure is not None
    assert result.failure.failed_tool == "flaky"
    assert result.tool_calls == 3


async def test_unknown_context_admits(
    make_emulator: Callable[..., OllamaEmulator], pool: ChatPool
) -> None:
    emulator = make_emulator(context_length=8192)
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")
    result = await run_tool_loop(
        chat, _ask("x" * 5000), context_length=None, estimator=TokenEstimator()
    )
    assert result.ok and len(emulator.records) == 1


async def test_engine_errors_end_the_loop_as_a_failure(
    make_emulator: Callable[..., OllamaEmulator], pool: ChatPool
) -> None:
    emulator = make_emulator()
    emulator.fail_next(500, count=2, path="/api/chat")
    chat = pool.get(provider="gpu", endpoint=emulator.url, model="tiny:1b")
    result = await run_tool_loop(
        chat, _ask("hello"), context_length=1024, estimator=TokenEstimator()
    )
    assert result.failure is not None
    assert result.failure.failure_type is FailureType.PROVIDER_ERROR
    assert "500" in result.failure.last_error


async def test_pool_builds_one_client_per_endpoint_model_and_settings() -> None:
    built: list[tuple[str, str, CallSettings]] = []

    def factory(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
        built.append((provider, endpoint, settings))
        return OllamaProvider(provider, endpoint, timeout=settings.timeout)

    chat_pool = ChatPool(factory)
    a = chat_pool.get(provider="p", endpoint="http://127.0.0.1:1", model="m1")
    assert chat_pool.get(provider="p", endpoint="http://127.0.0.1:1", model="m1") is a
    chat_pool.get(provider="p", endpoint="http://127.0.0.1:1", model="m2")
    chat_pool.get(provider="p", endpoint="http://127.0.0.1:1", model="m1",
                  settings=CallSettings(temperature=0.1, timeout=5.0))
    chat_pool.get(provider="q", endpoint="http://127.0.0.1:2", model="m1")
    assert len(built) == len(chat_pool) == 4
    assert built[0] == ("p", "http://127.0.0.1:1", CallSettings())
    assert built[2][2].options() == {"temperature": 0.1}
    await chat_pool.close()
    assert len(chat_pool) == 0
