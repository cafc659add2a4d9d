"""Ollama's durations (``keep_alive``): seconds, or ``"5m"``-style strings.

One parser for every side that reads a client's ``keep_alive``: the emulator (as the
engine would) and the gateway (before it forwards the call). A string is a plain number
of seconds (``"300"``, ``"-1"``) or Go's duration syntax, as Ollama reads it: unit-tagged
parts that add up (``"1h30m"``, ``"1.5h"``, ``"250ms"``). Negative means "forever",
as in Ollama; anything that is not a finite duration Ollama could hold (``"nan"``,
``"inf"``, a 400-digit number) is refused rather than poisoning an expiry.
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_DURATION_S", "DurationError", "duration_seconds"]

#: The longest duration Ollama can hold (Go's ``time.Duration`` is int64 nanoseconds).
MAX_DURATION_S = (2**63 - 1) / 1e9
# Go's time.ParseDuration units (µ written both ways, as Go accepts).
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 0.001, "s": 1.0,
          "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})(ns|us|µs|μs|ms|s|m|h)")
_GO_DURATION = re.compile(rf"[+-]?(?:{_NUMBER}(?:ns|us|µs|μs|ms|s|m|h))+")


class DurationError(ValueError):
    """Not a duration; the message fits a 400 answer."""


def duration_seconds(value: object, *, field: str = "keep_alive") -> float:
    """Seconds of ``value`` (``math.inf`` for a negative one); :class:`DurationError`
    when it is not a duration."""
    if isinstance(value, bool):
        raise DurationError(f"{field} must be a number of seconds or a duration")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            raise DurationError(f"{field} is out of range") from None
    elif isinstance(value, str):
        seconds = _text_seconds(value, field)
    else:
        raise DurationError(f"{field} must be a number of seconds or a duration")
    if not math.isfinite(seconds) or abs(seconds) > MAX_DURATION_S:
        raise DurationError(f"{field} is out of range")
    return math.inf if seconds < 0 else seconds


def _text_seconds(value: str, field: str) -> float:
    """A string duration: a plain number of seconds, or Go's ``1h30m`` syntax."""
    text = value.strip()
    if _GO_DURATION.fullmatch(text):
        sign = -1.0 if text.startswith("-") else 1.0
        return sign * sum(float(number) * _UNITS[unit]
                          for number, unit in _PART.findall(text))
    try:
        # "nan", "inf" and "1e999" read as numbers here; the caller refuses them as
        # out of range, the same answer as for the numbers themselves
        return float(text)
    except ValueError:
        pass
    raise DurationError(f"{field} {value[:40]!r} is not a duration (seconds, or "
                        "a duration such as 30s, 5m or 1h30m)")
