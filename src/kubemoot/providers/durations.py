"""Ollama's durations (``keep_alive``): seconds, or ``"5m"``-style strings.

One parser for every side that reads a client's ``keep_alive``: the emulator (as the
engine would) and the gateway (before it forwards the call). Negative means "forever",
as in Ollama; anything that is not a finite duration Ollama could hold (``"nan"``,
``"inf"``, a 400-digit number) is refused rather than poisoning an expiry.
"""

from __future__ import annotations

import math

__all__ = ["MAX_DURATION_S", "DurationError", "duration_seconds"]

#: The longest duration Ollama can hold (Go's ``time.Duration`` is int64 nanoseconds).
MAX_DURATION_S = (2**63 - 1) / 1e9
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


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
        text = value.strip()
        unit = next((u for u in ("ms", "s", "m", "h") if text.endswith(u)), "")
        try:
            seconds = float(text[: len(text) - len(unit)]) * _UNITS.get(unit, 1.0)
        except ValueError:
            raise DurationError(f"{field} {value[:40]!r} is not a duration") from None
    else:
        raise DurationError(f"{field} must be a number of seconds or a duration")
    if not math.isfinite(seconds) or abs(seconds) > MAX_DURATION_S:
        raise DurationError(f"{field} is out of range")
    return math.inf if seconds < 0 else seconds
