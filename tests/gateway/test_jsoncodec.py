"""The gateway's JSON codec (gateway/jsoncodec.py) accepts and refuses what Python's json
did, with the same words, where orjson alone would differ."""

from __future__ import annotations

import json

import pytest

from kubemoot.gateway.jsoncodec import JsonReply, dumps, loads


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def test_an_integer_past_64_bits_is_still_read() -> None:
    assert loads(b'{"seed": 123456789012345678901234567890}') == {
        "seed": 123456789012345678901234567890}


def test_nesting_past_orjsons_limit_is_read_or_refused_as_a_value_error() -> None:
    # Where the standard library gives up with RecursionError, the refusal is the
    # ValueError of any other bad text: the callers that handle an engine's broken
    # answer catch ValueError (tests/gateway/test_engine_nested_answer.py).
    for depth in (1100, 100_000):
        deep = b"[" * depth + b"]" * depth
        try:
            expected: object = json.loads(deep)
        except RecursionError:
            with pytest.raises(ValueError, match="nested too deeply"):
                loads(deep)
        else:
            assert loads(deep) == expected


@pytest.mark.parametrize("text", [b"{not json", b"{", b'{"a": 1,}'])
def test_a_refusal_says_what_pythons_json_says(text: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        loads(text, parse_constant=_no_constant)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused(constant: str) -> None:
    with pytest.raises(ValueError, match=f"{constant} is not a JSON number"):
        loads(f'{{"temperature": {constant}}}', parse_constant=_no_constant)


def test_a_reply_is_compact_utf8_json() -> None:
    value = {"content": "héllo ✓", "n": 1, "f": 0.5, "none": None, "list": [True]}
    assert json.loads(dumps(value)) == value
    assert JsonReply(value).body == dumps(value)
    assert b" " not in dumps({"a": [1, 2]})


def test_a_type_orjson_does_not_know_takes_the_slow_path() -> None:
    class Name(str):
        __slots__ = ()

    assert json.loads(dumps({"model": Name("qwen3:8b")})) == {"model": "qwen3:8b"}
