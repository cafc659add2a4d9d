"""Per-provider circuit breaker.

A provider that fails several calls in a row is taken out of every placement for a
cool-down, then admitted again on trial (half-open): one success closes it, one more
failure opens it again. Time comes from the injected clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kubemoot.clock import Clock


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(slots=True)
class _Circuit:
    failures: int = 0
    opened_at: float | None = None


class CircuitBreakers:
    """One breaker per provider name."""

    def __init__(self, *, clock: Clock, threshold: int = 3, cooldown_seconds: float = 30.0) -> None:
        if threshold < 1:
            raise ValueError("threshold must be at least 1")
        self._clock = clock
        self._threshold = threshold
        self._cooldown = cooldown_seconds
        self._circuits: dict[str, _Circuit] = {}

    def state(self, provider: str) -> CircuitState:
        circuit = self._circuits.get(provider)
        if circuit is None or circuit.opened_at is None:
            return CircuitState.CLOSED
        if self._clock.now() - circuit.opened_at >= self._cooldown:
            return CircuitState.HALF_OPEN
        return CircuitState.OPEN

    def tracked(self) -> frozenset[str]:
        """Providers with failures on record (every other one is closed)."""
        return frozenset(self._circuits)

    def allows(self, provider: str) -> bool:
        """Whether a call may be placed there now (closed or on trial)."""
        return self.state(provider) is not CircuitState.OPEN

    def record_success(self, provider: str) -> None:
        self._circuits.pop(provider, None)

    def record_failure(self, provider: str) -> None:
        circuit = self._circuits.setdefault(provider, _Circuit())
        if self.state(provider) is CircuitState.HALF_OPEN:
            # The trial failed: open again for a full cool-down.
            circuit.opened_at = self._clock.now()
            return
        circuit.failures += 1
        if circuit.failures >= self._threshold and circuit.opened_at is None:
            circuit.opened_at = self._clock.now()
