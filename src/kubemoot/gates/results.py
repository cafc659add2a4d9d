"""Typed gate verdicts and the bounded outcomes of a decision.

A gate is not a boolean. Four verdicts keep "violated" apart from "not known yet":

* ``PASS`` — valid evidence shows the requirement is met;
* ``FAIL`` — evidence shows the requirement is violated (the candidate is out);
* ``UNKNOWN`` — the evidence the gate needs is absent;
* ``STALE`` — evidence exists but is older than the freshness policy allows.

UNKNOWN and STALE are never treated as PASS: they make a candidate *uncertain*,
which is what lets a decision say DEFER ("not known yet") instead of
UNSCHEDULABLE ("impossible"). The one exception is declared by the gate itself, on
the result: an UNKNOWN with ``admits_unknown`` set lets the candidate through (the
per-call context gate: a context nobody published never refuses a call).

:func:`standing` is the one rule that turns a candidate's results into its
:class:`Standing`; the engine, the operator's tables and the runtime's record all use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

__all__ = ["GateResult", "Outcome", "Standing", "Verdict", "standing", "verdict_standing"]

# One shared, read-only empty mapping: most PASS results carry little evidence and
# the operator-side scheduler creates results by the hundred thousand.
_NO_EVIDENCE: Mapping[str, Any] = MappingProxyType({})

# Results are immutable, so an evidence-free PASS can be shared. A bounded cache keeps
# hot gates (a constant "fits" reason) from allocating one result per candidate.
_PASS_CACHE: dict[tuple[str, str], GateResult] = {}
_PASS_CACHE_LIMIT = 4096


class Verdict(StrEnum):
    """What one gate concluded about one candidate."""

    PASS = "PASS"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"
    STALE = "STALE"


class Outcome(StrEnum):
    """The bounded result of one decision."""

    PLACE = "PLACE"
    """At least one candidate passed every gate; the best-scoring one is chosen."""
    UNSCHEDULABLE = "UNSCHEDULABLE"
    """Every candidate failed a gate decisively (or there were no candidates)."""
    DEFER = "DEFER"
    """Nothing is feasible now, but some candidate waits on UNKNOWN/STALE evidence."""


class Standing(StrEnum):
    """Where a candidate ends up after all its gates."""

    FEASIBLE = "feasible"
    UNCERTAIN = "uncertain"
    HARD_FAILED = "hardFailed"


# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read under callgrind, a module global about
# 150): the members read once or more per call are kept at module level.
_PASS, _FAIL, _FEASIBLE = Verdict.PASS, Verdict.FAIL, Standing.FEASIBLE


@dataclass(frozen=True, slots=True)
class GateResult:
    """One gate's verdict on one candidate, with the evidence that explains it.

    ``evidence`` holds the facts the verdict rests on (which field, which value,
    what was required) as JSON-ready data; ``observed_at`` is when that evidence
    was observed (RFC 3339), if known. ``admits_unknown`` (UNKNOWN only) says that
    the missing evidence does not hold the candidate back: it stays feasible.
    """

    gate: str
    result: Verdict
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=lambda: _NO_EVIDENCE)
    observed_at: str | None = None
    admits_unknown: bool = False

    def __post_init__(self) -> None:
        if self.admits_unknown and self.result is not Verdict.UNKNOWN:
            raise ValueError(
                f"gate {self.gate!r}: admits_unknown is for an UNKNOWN result, "
                f"not {self.result.value}"
            )

    @classmethod
    def pass_(
        cls, gate: str, reason: str, *, observed_at: str | None = None, **evidence: Any
    ) -> GateResult:
        """A PASS: the evidence shows the requirement is met."""
        if evidence or observed_at is not None or cls is not GateResult:
            return cls(gate, _PASS, reason, evidence or _NO_EVIDENCE, observed_at)
        cached = _PASS_CACHE.get((gate, reason))
        if cached is None:
            cached = cls(gate, _PASS, reason, _NO_EVIDENCE, None)
            if len(_PASS_CACHE) < _PASS_CACHE_LIMIT:
                _PASS_CACHE[(gate, reason)] = cached
        return cached

    @classmethod
    def fail(
        cls, gate: str, reason: str, *, observed_at: str | None = None, **evidence: Any
    ) -> GateResult:
        """A FAIL: the evidence shows the requirement is violated."""
        return cls(gate, Verdict.FAIL, reason, evidence or _NO_EVIDENCE, observed_at)

    @classmethod
    def unknown(
        cls,
        gate: str,
        reason: str,
        *,
        observed_at: str | None = None,
        admits: bool = False,
        **evidence: Any,
    ) -> GateResult:
        """An UNKNOWN: the evidence the gate needs is absent.

        ``admits=True`` when the gate's policy is that this absence lets the candidate
        through (see :attr:`admits_unknown`).
        """
        return cls(gate, Verdict.UNKNOWN, reason, evidence or _NO_EVIDENCE, observed_at, admits)

    @classmethod
    def stale(
        cls, gate: str, reason: str, *, observed_at: str | None = None, **evidence: Any
    ) -> GateResult:
        """A STALE: evidence exists but is older than the freshness policy allows."""
        return cls(gate, Verdict.STALE, reason, evidence or _NO_EVIDENCE, observed_at)

    @property
    def passed(self) -> bool:
        """True only for PASS; UNKNOWN and STALE are not a pass."""
        return self.result is _PASS

    @property
    def admits(self) -> bool:
        """Does this result let the candidate through: a PASS, or an admitting UNKNOWN."""
        return self.result is _PASS or self.admits_unknown

    @property
    def waits(self) -> bool:
        """An UNKNOWN or STALE that does not admit: evidence the candidate waits on."""
        return not self.admits and self.result is not _FAIL

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, camelCase: ``{result, reason, evidence, observedAt?}``."""
        data: dict[str, Any] = {
            "result": self.result.value,
            "reason": self.reason,
            "evidence": jsonable(self.evidence),
        }
        if self.observed_at is not None:
            data["observedAt"] = self.observed_at
        return data


def standing(results: Iterable[GateResult]) -> Standing:
    """Where a candidate stands after these results: the one standing rule.

    Any FAIL makes it hard-failed (even beside an UNKNOWN); otherwise any result that
    does not admit (STALE, or an UNKNOWN without ``admits_unknown``) makes it
    uncertain; otherwise, including with no results at all, it is feasible.
    """
    uncertain = False
    for result in results:
        if result.result is _FAIL:
            return Standing.HARD_FAILED
        if not uncertain and not result.admits:
            uncertain = True
    return Standing.UNCERTAIN if uncertain else _FEASIBLE


def verdict_standing(verdicts: Sequence[Verdict]) -> Standing:
    """:func:`standing` of results with these verdicts, none of them an admitting UNKNOWN.

    For callers that judge many candidates and make the results (reasons, evidence) only
    when a record reads them; the rule is the same.
    """
    if Verdict.FAIL in verdicts:
        return Standing.HARD_FAILED
    if Verdict.UNKNOWN in verdicts or Verdict.STALE in verdicts:
        return Standing.UNCERTAIN
    return Standing.FEASIBLE


def jsonable(value: Any) -> Any:
    """Turn evidence into plain JSON/YAML data (enums to their values, tuples to lists)."""
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, set | frozenset) else items
    return str(value)
