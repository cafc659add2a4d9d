"""The call service's own promises: estimates that never raise, ids that never collide."""

from __future__ import annotations

import pytest

from kubemoot.clock import ManualClock
from kubemoot.runtime.builder import build_runtime
from kubemoot.runtime.tokens import TokenEstimator, message_chars, prompt_chars
from kubemoot.store.memory import MemoryKV


@pytest.mark.parametrize("message, at_least", [
    ({"role": "assistant", "tool_calls": 5}, 1),  # not a list
    ({"role": "assistant", "tool_calls": [{"function": "lookup"}]}, len("lookup")),
    ({"role": "assistant", "tool_calls": [7, None, "x"]}, 1),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "f",
                                                        "arguments": {1, 2}}}]}, 1),
    ("just a string", len("just a string")),  # not an object at all
    ({"content": None, "tool_calls": None}, 0),
])
def test_malformed_messages_are_counted_not_raised(message: object, at_least: int) -> None:
    assert message_chars(message) >= at_least
    assert TokenEstimator().estimate_prompt([message]) >= 0  # type: ignore[list-item]


def test_tools_that_are_not_json_are_counted_not_raised() -> None:
    assert prompt_chars([], [{"name": "t", "bad": {1, 2}}, {1: "a", "b": 2}]) > 0


async def test_two_replicas_never_name_two_calls_alike() -> None:
    clock = ManualClock(0.0)
    services = [(await build_runtime(MemoryKV(clock), clock=clock)).calls for _ in range(2)]
    ids = [s.thread_id("gateway:anonymous") for s in services]
    assert ids[0] != ids[1]  # both first calls of an anonymous caller
    assert all(s.identity in i for s, i in zip(services, ids, strict=True))
    holders = {s.holder_id("crew/a", "t1", "mulling") for s in services}
    assert len(holders) == 2
