"""The gateway's own per-call work that was cut, and that its answers are unchanged.

The access log reads a reply's token counts from the end of its tail with
``bytes.rfind`` instead of searching the whole tail with a regular expression per
kind; it finds what the expressions found (the last ``"key": digits`` of either key).
The gateway, the call service and the call log keep the event loop they serve on
rather than asking asyncio for it (a system call each time on Python 3.11).
"""

from __future__ import annotations

import cProfile
import pstats
import re

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot import metrics
from kubemoot.gateway.access import _ADDER, _COUNTS, AccessLog
from kubemoot.gateway.jsoncodec import has_long_digits, loads
from kubemoot.gateway.openai import new_id
from tests.gateway.conftest import Fleet

BODY = {"model": "small:1b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}

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
               {b"provider": b"gpu"}, 0.001, 0.002, tail)
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


@pytest.fixture
def fleet(quiet_card: Fleet) -> Fleet:
    """One card, probed at start-up only (conftest's quiet_card)."""
    return quiet_card


def _by_caller(stats: pstats.Stats, name: str) -> dict[str, int]:
    """Calls of the function named ``name`` (a C function's ``<built-in …>`` name or a
    Python one's), by the calling file and function."""
    found: dict[str, int] = {}
    for (_file, _line, fn), entry in stats.stats.items():  # type: ignore[attr-defined]
        if fn != name:
            continue
        for (by, _l, by_fn), counts in entry[4].items():
            key = f"{by}:{by_fn}"
            found[key] = found.get(key, 0) + counts[1]
    return found


#: The files of this wave's per-call cut: none of them asks asyncio for the running loop.
_OURS = ("/kubemoot/gateway/", "/kubemoot/runtime/calls.py", "/kubemoot/dashboard/calllog.py")


async def test_a_forwarded_call_never_asks_for_the_running_loop_in_the_gateway(
        fleet: Fleet) -> None:
    """Each ``asyncio.get_running_loop()`` is a getpid system call on Python 3.11 (and
    ``asyncio.current_task()`` without a loop makes one); the gateway, the call service
    and the call log keep the loop they serve on instead of asking on every call."""
    profile = cProfile.Profile()
    async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as http:
        warm = await http.post("/api/chat", json=BODY)  # the load happens here
        assert warm.status_code == 200, warm.text
        profile.enable()
        try:
            for path, body in (("/api/chat", BODY), ("/api/chat", {**BODY, "stream": True}),
                               ("/v1/chat/completions", BODY),
                               ("/v1/chat/completions", {**BODY, "stream": True})):
                answer = await http.post(path, json=body)
                assert answer.status_code == 200, answer.text
            await fleet.finished.until(5)
        finally:
            profile.disable()
    stats = pstats.Stats(profile)
    asked = _by_caller(stats, "<built-in method _asyncio.get_running_loop>")
    assert asked, "no call of get_running_loop was seen at all: the profile did not take"
    assert not {k: n for k, n in asked.items() if any(part in k for part in _OURS)}
    # current_task() asks for the loop unless given one: the gateway gives its own
    current = _by_caller(stats, "current_task")
    theirs = sum(n for k, n in current.items() if not any(part in k for part in _OURS))
    ours = sum(n for k, n in current.items() if any(part in k for part in _OURS))
    assert ours >= 4  # each call's open_watching asks for its task
    assert asked.get(next((k for k in asked if k.endswith(":current_task")), ""), 0) <= theirs
    # the headers it reads and the caller it notes come from the scope: no Starlette
    # Headers or State is built for an inference call
    built = {f"{file}:{fn}": entry[1]
             for (file, _line, fn), entry in stats.stats.items()  # type: ignore[attr-defined]
             if file.endswith("starlette/datastructures.py")}
    assert built == {}


def test_an_openai_reply_id_is_24_random_hex_digits_drawn_without_a_uuid() -> None:
    profile = cProfile.Profile()
    profile.enable()
    try:
        ids = [new_id() for _ in range(50)] + [new_id("cmpl")]
    finally:
        profile.disable()
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", i) for i in ids[:-1]), ids
    assert re.fullmatch(r"cmpl-[0-9a-f]{24}", ids[-1])
    assert len(set(ids)) == len(ids)
    assert _by_caller(pstats.Stats(profile), "uuid4") == {}


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([b"1", b"0", b"9", b"12345", b"1234567890", b"a", b" ",
                                 b".", b"-", b'"', b"\xd9\xa1", b"\xff"]),
                max_size=60).map(b"".join))
def test_long_digits_are_found_where_the_expression_found_them(raw: bytes) -> None:
    assert has_long_digits(raw) == (re.search(rb"\d{20}", raw) is not None)


def test_a_body_is_parsed_without_a_regular_expression_search() -> None:
    body = (b'{"model":"qwen3:8b","done":true,"total_duration":123456789,"message":'
            b'{"role":"assistant","content":"' + b"words 12 " * 40 + b'"}}')
    profile = cProfile.Profile()
    profile.enable()
    try:
        value = loads(body)
        big = loads(b'{"n": 123456789012345678901234567890}')
    finally:
        profile.disable()
    assert value["total_duration"] == 123456789
    assert big == {"n": 123456789012345678901234567890}  # exact: the long path still taken
    # (the standard library's parser of the long path matches its numbers: no search)
    searches = [name for (_file, _line, name) in pstats.Stats(profile).stats  # type: ignore[attr-defined]
                if "re.Pattern" in name and "search" in name]
    assert searches == []


def _compute_seconds_by_isinstance(reply: object) -> float:
    """The engine's time on a reply as the gateway read it before (isinstance checks)."""
    if not isinstance(reply, dict):
        return 0.0
    total, load = reply.get("total_duration"), reply.get("load_duration")
    if not isinstance(total, int | float) or isinstance(total, bool):
        return 0.0
    load = load if isinstance(load, int | float) and not isinstance(load, bool) else 0
    return max(0.0, (total - load) / 1e9)


_DURATION = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**13),
                      st.floats(-1e12, 1e13, allow_nan=False), st.text(max_size=3),
                      st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.fixed_dictionaries({}, optional={"total_duration": _DURATION,
                                                     "load_duration": _DURATION}),
                 _DURATION))
def test_an_answers_compute_time_is_read_as_before(reply: object) -> None:
    """Read by exact type (a parsed answer holds exactly ints and floats), where
    isinstance was asked five times per call: the same seconds for any parsed value."""
    from kubemoot.gateway.calls import _compute_seconds

    assert _compute_seconds(reply) == _compute_seconds_by_isinstance(reply)
