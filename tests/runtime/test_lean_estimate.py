"""The prompt estimate every gateway call makes, counted the same way with less Python.

``CallService.estimate`` runs once per call. A chat message that is a plain dict with
text and no tool calls is now counted by exact type, without an ``isinstance`` of the
``Mapping`` ABC (Python code in ``abc``) per message, without a copy of the list, and
without a generator step per message; the figure must be what the counting rules said
before for any messages a client may send.
"""

from __future__ import annotations

import cProfile
import json
import math
import pstats
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kubemoot.runtime.calls import CallService
from kubemoot.runtime.tokens import MESSAGE_OVERHEAD_TOKENS, TokenEstimator


def _reference_chars(message: object) -> int:
    """message_chars as it was written before the exact-type path."""
    if not isinstance(message, Mapping):
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
        if isinstance(arguments, str):
            total += len(arguments)
        else:
            try:
                total += len(json.dumps(arguments))
            except (TypeError, ValueError):
                total += len(str(arguments))
    return total


def _reference(messages: Sequence[object], tools: Sequence[Mapping[str, Any]] | None,
               ratio: float = 3.5) -> int:
    """CallService.estimate as it was: non-mappings wrapped as content, then the
    estimator's messages and tool specifications."""
    listed = [m if isinstance(m, Mapping) else {"content": m} for m in messages]
    chars = sum(_reference_chars(m) for m in listed)
    spec = 0
    for tool in tools or ():
        spec += len(json.dumps(tool, sort_keys=True))
    return (math.ceil(max(0, chars) / ratio) + MESSAGE_OVERHEAD_TOKENS * len(listed)
            + math.ceil(spec / ratio))


_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=30)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
_calls = st.lists(st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": st.text(max_size=10),
                                        "arguments": _values | st.text(max_size=20)})})
    | _values, max_size=3)
_messages = st.lists(
    st.fixed_dictionaries({"role": st.just("user")},
                          optional={"content": _values, "tool_calls": _calls | _scalars})
    | _scalars, max_size=4)
_tools = st.none() | st.lists(st.fixed_dictionaries(
    {"type": st.just("function"),
     "function": st.fixed_dictionaries({"name": st.text(max_size=8)})}), max_size=2)


def _service() -> CallService:
    return CallService(planner=None, waiter=None, clock=None)  # type: ignore[arg-type]


@given(_messages, _tools)
def test_the_estimate_is_the_one_the_rules_gave_before(messages: list[object],
                                                       tools: list[dict[str, Any]] | None,
                                                       ) -> None:
    assert _service().estimate("m", messages, tools) == _reference(messages, tools)


def test_a_learnt_ratio_is_used_on_the_short_path_too() -> None:
    estimator = TokenEstimator(chars_per_token=2.0)
    messages = [{"role": "user", "content": "x" * 10}]
    assert estimator.estimate_prompt(messages) == 5 + MESSAGE_OVERHEAD_TOKENS


def test_a_plain_chat_is_estimated_without_the_abc_check_or_a_copy() -> None:
    service = _service()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    service.estimate("m", messages)  # the model's estimator is made once, before counting
    profile = cProfile.Profile()
    profile.enable()
    tokens = service.estimate("m", messages)
    profile.disable()
    assert tokens == _reference(messages, None)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    names = {(filename.rsplit("/", 1)[-1], name) for filename, _line, name in stats}
    assert not any(name == "__instancecheck__" for _f, name in names), names
    assert not any(name in ("<listcomp>", "<genexpr>") for _f, name in names), names
    # 41 calls counted here before (the profiler's own ``disable`` among them), 17 now
    calls = sum(entry[1] for entry in stats.values())
    assert calls <= 17, calls
