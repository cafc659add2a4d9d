"""JSON on the gateway's hot path: orjson (C) for the common case, the standard library's
rules for everything else.

Every call parses the client's body and the engine's reply and encodes a reply; with
Python's ``json`` those were a visible share of the gateway's time (docs/performance.md).
orjson is several times faster, but it differs at the edges: it reads an integer past
64 bits as a float (losing digits), refuses nesting past 1,024 levels, and words its
errors its own way. So :func:`loads` leaves any text with a run of 20 digits or more
to ``json`` (two passes in C, far cheaper than the parse), and whenever orjson refuses a
text, parses it again with ``json``: the text is then accepted or refused exactly as
before, with the same messages (NaN and Infinity are refused either way: orjson never
reads them, and the fallback takes ``parse_constant``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response

__all__ = ["JsonReply", "RawJsonReply", "dumps", "loads"]

#: Each byte → 0 for an ASCII digit (what ``\d`` is in a bytes pattern), 1 otherwise.
_DIGIT_ZERO = bytes(0 if chr(b).isdigit() and b < 128 else 1 for b in range(256))
#: 20 digits in a row, so mapped: the shortest integer that may not fit in 64 bits
#: (2**64 has 20).
_LONG_DIGITS = bytes(20)


def has_long_digits(raw: bytes) -> bool:
    """Does ``raw`` hold 20 ASCII digits in a row (anywhere, strings included)?

    What ``re.search(rb"\\d{20}", raw)`` says, as a byte map and a substring search,
    both in C: the expression tried a run at every position, several times the cost of
    the parse itself for a short body (every call parses two).
    """
    return _LONG_DIGITS in raw.translate(_DIGIT_ZERO)


def loads(raw: bytes | str, *, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``raw`` parsed as JSON; raises what ``json.loads`` raises for text it refuses,
    and a ``ValueError`` for text nested too deeply (where ``json.loads`` raises
    ``RecursionError``, which no caller that handles a bad answer expects)."""
    # has_long_digits, spelt out: two calls per gateway call
    if _LONG_DIGITS in (raw if isinstance(raw, bytes) else raw.encode()).translate(_DIGIT_ZERO):
        # maybe an integer past 64 bits, which orjson would turn into a float
        return _stdlib_loads(raw, parse_constant)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # the standard library decides (and words) every refusal, as it always did
        return _stdlib_loads(raw, parse_constant)


def _stdlib_loads(raw: bytes | str, parse_constant: Callable[[str], Any] | None) -> Any:
    try:
        return json.loads(raw, parse_constant=parse_constant)
    except RecursionError:
        # an engine's answer of 200,000 "[" made GET /api/ps a 500 with a traceback
        raise ValueError("JSON nested too deeply") from None


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (what ``JSONResponse`` sends, made by orjson).

    A NaN or infinite float becomes ``null`` (JSON has no such numbers); keys that are
    not strings are written as strings.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        # a type orjson does not know (a subclass of str or int, say): the slow path
        return json.dumps(value, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")


class JsonReply(JSONResponse):
    """Starlette's ``JSONResponse``, encoded by :func:`dumps`."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


class RawJsonReply(Response):
    """A 200 JSON reply whose body is already encoded and whose extra headers are
    already bytes (the call's decision headers).

    Starlette's ``Response`` encodes and lower-cases every header on each reply; the
    answer of every call the gateway forwards is one of these, so its headers are
    given as they go on the wire (names in lower case, as Starlette writes them).
    """

    def __init__(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = 200
        self.body = body
        self.background = None
        self.raw_headers = [(b"content-length", str(len(body)).encode()), _JSON_TYPE,
                            *headers]


_JSON_TYPE = (b"content-type", b"application/json")
