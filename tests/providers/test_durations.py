"""Ollama's keep_alive durations, read alike by the emulator and the gateway."""

from __future__ import annotations

import math

import pytest

from kubemoot.providers.durations import DurationError, duration_seconds


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(30, 30.0), (1.5, 1.5), ("90", 90.0), ("250ms", 0.25), ("10s", 10.0), ("5m", 300.0),
     ("2h", 7200.0), (" 1m ", 60.0), (0, 0.0), (-1, math.inf), ("-5m", math.inf),
     # Go's compound syntax, as Ollama parses a string keep_alive
     ("1h30m", 5400.0), ("1.5h", 5400.0), ("2m30s", 150.0), ("1m500ms", 60.5),
     ("-1", math.inf), ("-1h30m", math.inf), ("0", 0.0), ("1500us", 0.0015)],
)
def test_a_duration_in_seconds(value: object, seconds: float) -> None:
    assert duration_seconds(value) == seconds


@pytest.mark.parametrize("value", [True, [], {}, "soon", "5x", "nan", "inf", "1h30", "h", "1e999",
                                   "1h 30m", "--1", "1.2.3s", float("nan"),
                                   10**400, "1" + "0" * 400, 1e300])
def test_anything_else_is_refused(value: object) -> None:
    with pytest.raises(DurationError, match="keep_alive"):
        duration_seconds(value)
