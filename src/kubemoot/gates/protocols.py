"""The two plugin shapes: a gate checks, a scorer ranks.

Plugins are small: one ``name`` and one method. They never see weights, never
decide the outcome and never look at other candidates; the engine
(:func:`kubemoot.gates.evaluate`) applies those rules in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from kubemoot.gates.results import GateResult

__all__ = ["Gate", "Scorer", "Weighted"]

C = TypeVar("C")
C_contra = TypeVar("C_contra", contravariant=True)


class Gate(Protocol[C_contra]):
    """A hard requirement: PASS, FAIL, UNKNOWN or STALE for one candidate."""

    @property
    def name(self) -> str:
        """The gate's name, as it appears in decision records."""
        ...

    def check(self, candidate: C_contra, /) -> GateResult:
        """Judge one candidate; never raises for ordinary missing data (that is UNKNOWN)."""
        ...


class Scorer(Protocol[C_contra]):
    """A preference over feasible candidates: higher is better."""

    @property
    def name(self) -> str:
        """The scorer's name, as it appears in score breakdowns."""
        ...

    def score(self, candidate: C_contra, /) -> float:
        """Score one feasible candidate (0–100 when the scorer is declared bounded)."""
        ...


@dataclass(frozen=True, slots=True)
class Weighted(Generic[C]):
    """A scorer with its weight, as the scoring policy declares it.

    ``bounded=True`` declares that the scorer's raw score lies in 0–100; the engine
    checks it and raises :class:`~kubemoot.gates.engine.ScoreRangeError` when a
    scorer breaks its declaration (a programming error, not a user error).
    Unbounded scorers (a sum of prefer weights, a signed provider weight) set it False.
    """

    scorer: Scorer[C]
    weight: float = 1.0
    bounded: bool = True

    @property
    def name(self) -> str:
        return self.scorer.name
