"""How many tokens a prompt will cost, before the engine says.

The engine reports the prompt size it evaluated (``prompt_eval_count``) after a call;
before that the runtime can only count characters. Prose runs near four characters a
token and JSON or code nearer three, so the estimate starts at 3.5 and then follows an
exponentially weighted average of what the engine reported. The average learns only
from reports that were not cut at the context limit: a silently truncated prompt reports
the cut size, which would teach a ratio far too generous. A cut report still bounds the
ratio from above (the whole prompt had at least that many tokens), so a ratio above the
bound drops to it: the next estimate is more conservative, never more generous.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DEFAULT_CHARS_PER_TOKEN",
    "DEFAULT_EMA_ALPHA",
    "MESSAGE_OVERHEAD_TOKENS",
    "TokenEstimator",
    "message_chars",
    "prompt_chars",
    "tool_spec_chars",
]

DEFAULT_CHARS_PER_TOKEN = 3.5
DEFAULT_EMA_ALPHA = 0.3  # weight of the newest report; a few calls settle the ratio
# Chat templates wrap every message in role markers; counting them keeps a prompt of
# many short messages from being underestimated before the engine has reported.
MESSAGE_OVERHEAD_TOKENS = 4
# Bounds on a learned ratio: a report outside them is noise (an empty prompt, a bug)
_MIN_RATIO = 1.0
_MAX_RATIO = 8.0


def message_chars(message: object) -> int:
    """Characters a message puts in the prompt: its text and any tool-call arguments.

    A client may send any JSON, so a malformed message (not an object, ``tool_calls: 5``,
    a call whose ``function`` is a string) counts what text it has instead of raising:
    the estimate sizes a placement, and the engine judges the request itself.
    """
    if type(message) is dict:
        # the message every call brings (text, no tool calls), told by exact type: an
        # ``isinstance`` of the ``Mapping`` ABC runs Python on each message of each call
        content = message.get("content")
        calls = message.get("tool_calls")
        if calls is None and type(content) is str:
            return len(content)
    elif not isinstance(message, Mapping):
        return len(str(message)) if message is not None else 0
    total = len(str(message.get("content") or ""))
    calls = message.get("tool_calls")
    if not isinstance(calls, list | tuple):
        return total + (len(str(calls)) if calls else 0)
    for call in calls:
        function = call.get("function", call) if isinstance(call, Mapping) else call
        if not isinstance(function, Mapping):
            total += len(str(function)) if function is not None else 0
            continue
        total += len(str(function.get("name", "")))
        arguments = function.get("arguments", {})
        total += len(arguments) if isinstance(arguments, str) else _json_chars(arguments)
    return total


def _json_chars(value: object) -> int:
    try:
        return len(json.dumps(value))
    except (TypeError, ValueError):  # not JSON (NaN is JSON to Python; sets are not)
        return len(str(value))


def tool_spec_chars(tools: Sequence[Mapping[str, Any]] | None) -> int:
    """Characters the tool specifications add (the engine renders them into the prompt)."""
    total = 0
    for tool in tools or ():
        try:
            total += len(json.dumps(tool, sort_keys=True))
        except (TypeError, ValueError):  # keys of mixed types, or not JSON at all
            total += len(str(tool))
    return total


def prompt_chars(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> int:
    """Characters of a whole prompt: messages, tool-call arguments, tool specs."""
    return sum(message_chars(m) for m in messages) + tool_spec_chars(tools)


class TokenEstimator:
    """Characters → tokens, with a characters-per-token ratio learned from the engine."""

    def __init__(
        self,
        *,
        chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
        alpha: float = DEFAULT_EMA_ALPHA,
    ) -> None:
        if chars_per_token <= 0:
            raise ValueError("chars_per_token must be positive")
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self._ratio = chars_per_token
        self._alpha = alpha
        self.observations = 0

    @property
    def chars_per_token(self) -> float:
        return self._ratio

    def estimate(self, chars: int) -> int:
        """Tokens for ``chars`` characters, rounded up (never under-count)."""
        return math.ceil(max(0, chars) / self._ratio)

    def estimate_messages(self, messages: Sequence[object]) -> int:
        """Tokens of some messages (text, tool-call arguments, template overhead)."""
        chars = 0
        for message in messages:  # a loop, not a generator's step per message
            chars += message_chars(message)
        return math.ceil(max(0, chars) / self._ratio) + MESSAGE_OVERHEAD_TOKENS * len(messages)

    def estimate_prompt(
        self,
        messages: Sequence[object],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """Tokens of a whole prompt: its messages and the tool specifications."""
        tokens = self.estimate_messages(messages)
        # no tools add no characters, and ``estimate(0)`` is 0
        return tokens + self.estimate(tool_spec_chars(tools)) if tools else tokens

    def observe(
        self, *, chars: int, tokens: int, messages: int = 0, truncated: bool = False
    ) -> None:
        """Learn from one engine report of ``tokens`` for a prompt of ``chars`` in
        ``messages`` messages (their template overhead is not text)."""
        tokens -= MESSAGE_OVERHEAD_TOKENS * messages
        if tokens <= 0 or chars <= 0:
            return
        sample = chars / tokens
        if truncated:
            # the true ratio is at most ``sample``; only ever tighten toward it
            if _MIN_RATIO <= sample < self._ratio:
                self._ratio = sample
            return
        if not _MIN_RATIO <= sample <= _MAX_RATIO:
            return
        self._ratio = self._alpha * sample + (1 - self._alpha) * self._ratio
        self.observations += 1
