"""Per-provider circuit breaker.

A provider that fails several calls in a row is taken out of every placement for a
cool-down, then admitted again on trial (half-open). Half-open lets exactly one call
through: the first placement that commits to the provider takes the trial
(:meth:`CircuitBreakers.admit`), and every other call sees the circuit as open until
the trial's verdict — one success closes it, one more failure opens it for another
cool-down, and a call that says nothing about the provider (cancelled, or ended before
reaching it) hands the trial to the next call. A trial whose holder never reports back
lapses after one cool-down, so a crashed caller cannot shut a provider out for good.

Only provider faults count (DESIGN §5); which failures those are is the caller's
judgement, made where the error is known. Time comes from the injected clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kubemoot.clock import Clock
from kubemoot.settings import DEFAULTS


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read, a module global about 150): a breaker
# is read for every provider of every placement round.
_CLOSED, _OPEN, _HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN


@dataclass(slots=True)
class _Circuit:
    failures: int = 0
    opened_at: float | None = None
    trial_since: float | None = None  # when the half-open trial call was admitted


class CircuitBreakers:
    """One breaker per provider name."""

    def __init__(
        self,
        *,
        clock: Clock,
        threshold: int = DEFAULTS.circuit_failure_threshold,
        cooldown_seconds: float = DEFAULTS.circuit_cooldown_seconds,
    ) -> None:
        if threshold < 1:
            raise ValueError("threshold must be at least 1")
        self._clock = clock
        self._threshold = threshold
        self._cooldown = cooldown_seconds
        self._circuits: dict[str, _Circuit] = {}

    def state(self, provider: str) -> CircuitState:
        circuit = self._circuits.get(provider)
        if circuit is None or circuit.opened_at is None:
            return _CLOSED
        if self._clock.now() - circuit.opened_at >= self._cooldown:
            return _HALF_OPEN
        return _OPEN

    def failures(self, provider: str) -> int:
        """Provider faults counted since the provider last succeeded."""
        circuit = self._circuits.get(provider)
        return 0 if circuit is None else circuit.failures

    def tracked(self) -> frozenset[str]:
        """Providers with failures on record (every other one is closed)."""
        return frozenset(self._circuits)

    def _trial_free(self, circuit: _Circuit) -> bool:
        return (circuit.trial_since is None
                or self._clock.now() - circuit.trial_since >= self._cooldown)

    def allows(self, provider: str) -> bool:
        """Whether a call may be placed there now: closed, or half-open with its trial
        still free. Reading never takes the trial; :meth:`admit` does."""
        state = self.state(provider)
        if state is _HALF_OPEN:
            return self._trial_free(self._circuits[provider])
        return state is _CLOSED

    def admit(self, provider: str) -> bool:
        """Commit one call to ``provider``: always while closed; while half-open only
        the first call, which becomes the trial; never while open."""
        state = self.state(provider)
        if state is _CLOSED:
            return True
        circuit = self._circuits[provider]
        if state is _OPEN or not self._trial_free(circuit):
            return False
        circuit.trial_since = self._clock.now()
        return True

    def record_success(self, provider: str) -> None:
        self._circuits.pop(provider, None)

    def record_failure(self, provider: str) -> None:
        circuit = self._circuits.setdefault(provider, _Circuit())
        circuit.trial_since = None
        if self.state(provider) is _HALF_OPEN:
            # The trial failed: open again for a full cool-down.
            circuit.opened_at = self._clock.now()
            return
        circuit.failures += 1
        if circuit.failures >= self._threshold and circuit.opened_at is None:
            circuit.opened_at = self._clock.now()

    def record_no_verdict(self, provider: str) -> None:
        """The call ended without saying anything about the provider (cancelled, or
        stopped before the engine was asked); a trial it held goes to the next call."""
        circuit = self._circuits.get(provider)
        if circuit is not None:
            circuit.trial_since = None
