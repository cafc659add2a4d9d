"""The tool loop, with the context guard and the tool-failure caps.

An engine does not reject a prompt longer than its context: it silently drops the
oldest messages, the question among them. So before *every* model call the loop
projects the next prompt's size — the size the engine reported for the previous call
plus an estimate of everything appended since (the assistant's reply with its tool-call
arguments, the tool results), or, before any report, an estimate of the whole prompt
including the tool specifications — and compares it with the context of the provider
the call runs on. A prompt that would not fit is never sent; the loop ends with
``CONTEXT_EXCEEDED``. An unknown context admits, as everywhere in the runtime.

The estimate can still be too generous (text with short tokens), so the engine's report
is checked after every call too: a prompt that evaluated to the whole context was cut,
and a reply to a cut prompt answers a question the model may never have seen. That reply
is discarded and the loop ends with ``CONTEXT_EXCEEDED`` as well — no silent truncation.

A tool that keeps failing (its server down, say) must not grind through every
iteration: the loop stops after 2 failures of one tool or 4 in all, naming the tool and
its last error, so the agent publishes a first-class ``failure`` signal.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubemoot.agent.signals import FailureType
from kubemoot.providers.protocol import (
    ChatResult,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
)
from kubemoot.runtime.tokens import TokenEstimator, prompt_chars

__all__ = [
    "ChatTarget",
    "ContextGuard",
    "LoopFailure",
    "Tool",
    "ToolLoopLimits",
    "ToolLoopResult",
    "run_tool_loop",
]

ToolHandler = Callable[[Mapping[str, Any]], Awaitable[str]]


class ChatTarget(Protocol):
    """What the loop calls: a chat bound to one provider and model (``PooledChat``)."""

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        num_ctx: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ChatResult: ...


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call; the handler's exception is the tool's failure."""

    name: str
    description: str
    handler: ToolHandler
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def spec(self) -> dict[str, Any]:
        """The tool specification in the engine's function-calling format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True, slots=True)
class ToolLoopLimits:
    """Caps per loop (the spec's numbers are the defaults)."""

    same_tool_failures: int = 2
    total_tool_failures: int = 4
    max_iterations: int = 15


@dataclass(frozen=True, slots=True)
class LoopFailure:
    """Why a loop stopped; ``provider_fault`` when the engine (not a tool, not the
    prompt's size) was to blame, which is what counts against its circuit;
    ``never_sent`` when its connection was refused before any byte of the request left
    (the one failure a call may try again, elsewhere)."""

    failure_type: FailureType
    last_error: str
    failed_tool: str | None = None
    provider_fault: bool = False
    never_sent: bool = False


@dataclass(slots=True)
class ToolLoopResult:
    """The loop's outcome: the final content, or why it stopped."""

    content: str = ""
    model_calls: int = 0
    tool_calls: int = 0
    failure: LoopFailure | None = None
    last_prompt_tokens: int | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None


class ContextGuard:
    """Projects the next prompt's size and says whether the context holds it."""

    def __init__(
        self,
        *,
        context_length: int | None,
        estimator: TokenEstimator,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.context_length = context_length
        self._estimator = estimator
        self._tools = list(tools or ())
        self._reported: int | None = None
        self._sent = 0  # how many messages the reported prompt covered

    def projected(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens the next prompt will take, by report where there is one."""
        if self._reported is None:
            return self._estimator.estimate_prompt(messages, self._tools)
        return self._reported + self._estimator.estimate_messages(messages[self._sent :])

    def admits(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        return self.context_length is None or self.projected(messages) <= self.context_length

    def record(self, messages: Sequence[Mapping[str, Any]], result: ChatResult) -> bool:
        """Take the engine's report for the prompt just sent, and learn from it.

        Returns whether the engine cut the prompt: it evaluated as many tokens as the
        context the call ran with (an engine never reports more than it kept).
        """
        if result.prompt_eval_count is None:
            # no report: keep projecting from the estimate of the whole prompt
            return False
        truncated = (
            self.context_length is not None and result.prompt_eval_count >= self.context_length
        )
        self._estimator.observe(
            chars=prompt_chars(messages, self._tools),
            tokens=result.prompt_eval_count,
            messages=len(messages),
            truncated=truncated,
        )
        self._reported = result.prompt_eval_count
        self._sent = len(messages)
        return truncated


def _call_name_and_arguments(call: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    function = call.get("function", call)
    name = str(function.get("name", ""))
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):  # some engines send the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = {"_raw": arguments}
    return name, dict(arguments) if isinstance(arguments, Mapping) else {}


async def run_tool_loop(
    chat: ChatTarget,
    messages: Sequence[Mapping[str, Any]],
    *,
    context_length: int | None,
    estimator: TokenEstimator,
    tools: Sequence[Tool] = (),
    limits: ToolLoopLimits | None = None,
) -> ToolLoopResult:
    """Call the model, run the tools it asks for, repeat until it answers or a cap trips.

    ``context_length`` is the context of the provider and model the call runs on
    (``None``: unknown, which admits). Provider errors end the loop as a failure too,
    so the caller has one path: ``result.failure`` → a ``failure`` signal.
    """
    limits = limits or ToolLoopLimits()
    history: list[dict[str, Any]] = [dict(m) for m in messages]
    specs = [tool.spec() for tool in tools]
    by_name = {tool.name: tool for tool in tools}
    guard = ContextGuard(context_length=context_length, estimator=estimator, tools=specs)
    failures: Counter[str] = Counter()
    result = ToolLoopResult(messages=history)

    for _ in range(limits.max_iterations):
        projected = guard.projected(history)
        if not guard.admits(history):
            result.failure = LoopFailure(
                FailureType.CONTEXT_EXCEEDED,
                f"the next prompt needs about {projected} tokens but the context holds "
                f"{context_length}; not sent, so the engine cannot cut it",
            )
            return result
        try:
            reply = await chat.chat(history, num_ctx=context_length, tools=specs or None)
        except ProviderTimeout as error:
            result.failure = LoopFailure(FailureType.PROVIDER_TIMEOUT, str(error),
                                         provider_fault=True)
            return result
        except ProviderError as error:
            refused = isinstance(error, ProviderUnavailable) and not error.sent
            result.failure = LoopFailure(FailureType.PROVIDER_ERROR, str(error),
                                         provider_fault=error.provider_fault,
                                         never_sent=refused)
            return result
        result.model_calls += 1
        truncated = guard.record(history, reply)
        result.last_prompt_tokens = reply.prompt_eval_count
        if truncated:
            # the reply (words or tool calls) was made from a prompt missing its oldest
            # part; using it would be exactly the silent truncation the guard exists for
            result.failure = LoopFailure(
                FailureType.CONTEXT_EXCEEDED,
                f"the engine cut the prompt at {reply.prompt_eval_count} tokens (the "
                f"context is {context_length}); its reply was discarded",
            )
            return result
        if not reply.tool_calls:
            result.content = reply.content
            return result

        history.append(
            {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
        )
        for call in reply.tool_calls:
            name, arguments = _call_name_and_arguments(call)
            result.tool_calls += 1
            tool = by_name.get(name)
            try:
                if tool is None:
                    raise LookupError(f"no tool named {name!r}")
                output = await tool.handler(arguments)
            except Exception as error:  # any tool error counts toward the caps
                failures[name] += 1
                last_error = f"{type(error).__name__}: {error}"
                if (
                    failures[name] >= limits.same_tool_failures
                    or failures.total() >= limits.total_tool_failures
                ):
                    result.failure = LoopFailure(
                        FailureType.TOOL_FAILURES, last_error, failed_tool=name
                    )
                    return result
                output = f"error: {last_error}"
            history.append({"role": "tool", "content": output, "tool_name": name})

    result.failure = LoopFailure(
        FailureType.MAX_ITERATIONS,
        f"no final answer after {limits.max_iterations} model calls",
    )
    return result
