"""Per-endpoint call latency: an exponentially weighted average of observed calls.

The queue cost needs "how long does a call here take"; before any call on an
endpoint was observed the settings' default stands in.
"""

from __future__ import annotations

from kubemoot.settings import DEFAULTS


class LatencyTracker:
    """Call-latency EMA per endpoint (or provider name; the caller picks the key)."""

    def __init__(
        self,
        *,
        alpha: float = DEFAULTS.latency_ema_alpha,
        default_seconds: float = DEFAULTS.default_latency_seconds,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._alpha = alpha
        self._default = default_seconds
        self._ema: dict[str, float] = {}
        #: Moves on every observation, so a cache of latencies knows when to look again.
        self.revision = 0

    def observe(self, endpoint: str, seconds: float) -> float:
        """Fold one finished call's duration in; returns the new average."""
        seconds = max(0.0, seconds)
        previous = self._ema.get(endpoint)
        value = seconds if previous is None else previous + self._alpha * (seconds - previous)
        self._ema[endpoint] = value
        self.revision += 1
        return value

    def latency(self, endpoint: str) -> float:
        """The average, or the default when nothing was observed yet."""
        return self._ema.get(endpoint, self._default)

    def observed(self, endpoint: str) -> bool:
        return endpoint in self._ema
