"""The gateway's own per-call work that was cut, and that its answers are unchanged.

The access log reads a reply's token counts from the end of its tail with
``bytes.rfind`` instead of searching the whole tail with a regular expression per
kind; it finds what the expressions found (the last ``"key": digits`` of either key).
"""

from __future__ import annotations

import cProfile
import pstats
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot import metrics
from kubemoot.gateway.access import _ADDER, _COUNTS, AccessLog

#: The expressions the access log searched each reply's tail with before.
_EXPRESSIONS = {
    "prompt": re.compile(rb'"(?:prompt_eval_count|prompt_tokens)"\s*:\s*(\d+)'),
    "completion": re.compile(rb'"(?:eval_count|completion_tokens)"\s*:\s*(\d+)'),
}

_PIECES = st.sampled_from([
    b'"prompt_eval_count"', b'"prompt_tokens"', b'"eval_count"', b'"completion_tokens"',
    b'"', b":", b" ", b"\n", b"\t", b",", b"7", b"42", b"x", b"eval_count", b"{", b"}",
    b'"prompt_', b'eval_count"', b"\xc3\xa9"])


def _by_expression(tail: bytes) -> dict[str, int]:
    found = {}
    for kind, expression in _EXPRESSIONS.items():
        matches = list(expression.finditer(tail))
        if matches:
            found[kind] = int(matches[-1].group(1))
    return found


def _counted(tail: bytes) -> dict[str, int]:
    seen: dict[str, int] = {}

    class _Adder:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def inc(self, amount: float) -> None:
            seen[self.kind] = int(amount)

    log = AccessLog(lambda *_: None)  # type: ignore[arg-type, return-value]
    # the metrics' children stand in for the registry's (left untouched)
    log._children[(_ADDER, metrics.GATEWAY_REQUESTS, "unmatched", "200")] = lambda _n: None
    log._calls[("gpu", "unmatched", "200")] = (
        lambda _n: None, _Observer(), _Observer(), {k: _Adder(k).inc for k in _COUNTS})
    log._count({"type": "http", "path": "/api/chat", "method": "POST"}, 200,
               {"provider": "gpu"}, 0.001, 0.002, tail)
    return seen


class _Observer:
    def observe(self, value: float) -> None:
        return None


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=40).map(b"".join))
def test_the_counts_are_what_the_expressions_found(tail: bytes) -> None:
    assert _counted(tail) == _by_expression(tail)


def test_an_engine_reply_is_counted_without_searching_it() -> None:
    tail = (b'{"model":"qwen3:8b","message":{"role":"assistant","content":"'
            + b"words " * 60 + b'"},"done":true,"total_duration":123,'
            b'"prompt_eval_count": 26,"eval_count" :12,"eval_duration":9}')
    profile = cProfile.Profile()
    profile.enable()
    try:
        counts = _counted(tail)
    finally:
        profile.disable()
    assert counts == {"prompt": 26, "completion": 12}
    searches = [name for (_file, _line, name) in pstats.Stats(profile).stats  # type: ignore[attr-defined]
                if "re.Pattern" in name and ("finditer" in name or "search" in name)]
    assert searches == []
