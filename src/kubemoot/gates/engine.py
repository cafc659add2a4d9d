"""The one decision engine: hard gates first, scores second, a bounded outcome.

Rules, applied here and nowhere else:

* every gate is evaluated for every candidate, so the record explains each failure
  (``stop_at_first_fail=True`` skips the remaining gates of a failed candidate on
  hot paths);
* a candidate's standing is :func:`~kubemoot.gates.results.standing` of its results:
  *feasible* iff every gate admits (PASS, or an UNKNOWN its gate declared admitting);
  any FAIL makes it *hard-failed* (even when another gate is UNKNOWN); otherwise it is
  *uncertain*. UNKNOWN and STALE are never coerced to PASS;
* scores are computed for feasible candidates only, so a failed candidate never
  competes however high its score would be; weights are applied here, and a scorer
  declared bounded must return 0–100;
* PLACE iff any candidate is feasible; DEFER iff none is but some is uncertain;
  UNSCHEDULABLE otherwise (every candidate hard-failed, or there were none).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from kubemoot.gates.protocols import Gate, Scorer, Weighted
from kubemoot.gates.record import CandidateResult, DecisionRecord
from kubemoot.gates.results import GateResult, Outcome, Standing, Verdict, standing

__all__ = ["ScoreRangeError", "default_recheck_triggers", "evaluate"]

C = TypeVar("C")

_FAIL = Verdict.FAIL
_SCORE_DIGITS = 9  # totals are rounded so that sums of equal terms tie exactly


class ScoreRangeError(ValueError):
    """A scorer declared bounded returned a score outside 0–100 (a programming error)."""


def evaluate(
    candidates: Iterable[C],
    *,
    key: Callable[[C], str],
    gates: Sequence[Gate[C]],
    scorers: Sequence[Weighted[C] | Scorer[C]] = (),
    tie_break: Callable[[C], Any] | None = None,
    subject: str,
    scheduler_version: str,
    scoring_policy_version: str,
    stop_at_first_fail: bool = False,
) -> DecisionRecord:
    """Decide over ``candidates`` and return the decision record.

    ``key`` gives each candidate a stable, unique string id. ``gates`` run in order.
    ``scorers`` are :class:`Weighted` scorers (a bare scorer counts as weight 1, and as
    bounded unless it has ``bounded = False``). Feasible candidates rank by total score,
    highest first; equal totals go to the smallest ``tie_break(candidate)`` (default:
    the id). Raises :class:`ScoreRangeError` if a bounded scorer leaves 0–100 and
    ``ValueError`` on duplicate ids.
    """
    weighted = [_as_weighted(s) for s in scorers]
    results: dict[str, CandidateResult] = {}
    feasible: list[tuple[str, C]] = []
    uncertain: list[str] = []
    hard_failed: list[str] = []

    for candidate in candidates:
        cid = key(candidate)
        if cid in results:
            raise ValueError(f"duplicate candidate id {cid!r}")
        checked: list[GateResult] = []
        for gate in gates:
            result = gate.check(candidate)
            checked.append(result)
            if stop_at_first_fail and result.result is _FAIL:
                break
        where = standing(checked)
        if where is Standing.HARD_FAILED:
            hard_failed.append(cid)
        elif where is Standing.UNCERTAIN:
            uncertain.append(cid)
        else:
            feasible.append((cid, candidate))
        results[cid] = CandidateResult(cid, where, tuple(checked))

    scores: dict[str, float] = {}
    breakdown: dict[str, dict[str, float]] = {}
    order: dict[str, Any] = {}
    for cid, candidate in feasible:
        total, breakdown[cid] = _score(candidate, cid, weighted)
        scores[cid] = total
        order[cid] = cid if tie_break is None else tie_break(candidate)
    ranked = tuple(sorted(scores, key=lambda cid: (-scores[cid], order[cid])))

    if ranked:
        outcome, chosen = Outcome.PLACE, ranked[0]
    elif uncertain:
        outcome, chosen = Outcome.DEFER, None
    else:
        outcome, chosen = Outcome.UNSCHEDULABLE, None

    record = DecisionRecord(
        subject=subject,
        scheduler_version=scheduler_version,
        scoring_policy_version=scoring_policy_version,
        outcome=outcome,
        chosen=chosen,
        feasible=tuple(sorted(scores)),
        uncertain=tuple(sorted(uncertain)),
        hard_failed=tuple(sorted(hard_failed)),
        candidates=results,
        ranked=ranked,
        scores=scores,
        score_breakdown=breakdown,
        weights={w.name: w.weight for w in weighted},
        reason="",
        recheck_triggers=(),
    )
    # Both explanations are derived from the finished record.
    return replace(
        record, reason=_reason(record), recheck_triggers=default_recheck_triggers(record)
    )


def _as_weighted(scorer: Weighted[C] | Scorer[C]) -> Weighted[C]:
    if isinstance(scorer, Weighted):
        return scorer
    return Weighted(scorer, 1.0, bool(getattr(scorer, "bounded", True)))


def _score(
    candidate: C, cid: str, weighted: Sequence[Weighted[C]]
) -> tuple[float, dict[str, float]]:
    total = 0.0
    raw_scores: dict[str, float] = {}
    for entry in weighted:
        raw = float(entry.scorer.score(candidate))
        if math.isnan(raw) or (entry.bounded and not 0.0 <= raw <= 100.0):
            raise ScoreRangeError(
                f"scorer {entry.name!r} returned {raw!r} for {cid!r}; a bounded score is 0–100"
            )
        raw_scores[entry.name] = raw
        total += entry.weight * raw
    return round(total, _SCORE_DIGITS), raw_scores


def _reason(record: DecisionRecord) -> str:
    total = len(record.candidates)
    if record.outcome is Outcome.PLACE:
        chosen = record.chosen
        assert chosen is not None
        others = len(record.feasible) - 1
        text = f"{chosen} passed every gate and has the highest score ({record.scores[chosen]:.2f})"
        if others:
            runner_up = record.ranked[1]
            text += f"; {others} other feasible, next {runner_up} ({record.scores[runner_up]:.2f})"
        return text + _excluded(record)
    if record.outcome is Outcome.DEFER:
        return (
            f"no candidate passes every gate yet; {len(record.uncertain)} of {total} "
            f"wait on UNKNOWN or STALE evidence ({', '.join(record.uncertain)})"
            + (f"; hard-failed: {', '.join(record.hard_failed)}" if record.hard_failed else "")
        )
    if total == 0:
        return "there are no candidates"
    return f"all {total} candidates fail a hard gate ({_failure_summary(record)})"


def _excluded(record: DecisionRecord) -> str:
    parts = []
    if record.hard_failed:
        parts.append(f"hard-failed: {_failure_summary(record)}")
    if record.uncertain:
        parts.append(f"uncertain: {', '.join(record.uncertain)}")
    return "; " + "; ".join(parts) if parts else ""


def _failure_summary(record: DecisionRecord, *, limit: int = 10) -> str:
    shown = [
        f"{cid} {'/'.join(g.gate for g in record.candidates[cid].failures)}"
        for cid in record.hard_failed[:limit]
    ]
    hidden = len(record.hard_failed) - len(shown)
    return ", ".join(shown) + (f" and {hidden} more" if hidden > 0 else "")


def default_recheck_triggers(record: DecisionRecord) -> tuple[str, ...]:
    """Which changes of evidence could change this decision, one line each.

    Uncertain candidates: each UNKNOWN gate whose evidence could arrive and each STALE
    gate whose evidence could be refreshed. Hard-failed candidates: the FAILs that would
    all have to clear. For PLACE, the chosen candidate losing a PASS is listed too.
    """
    triggers: list[str] = []
    for cid in record.uncertain:
        for result in record.candidates[cid].unresolved:
            action = "is supplied" if result.result is Verdict.UNKNOWN else "is refreshed"
            triggers.append(
                f"{cid}: {result.gate} evidence {action} (now {result.result.value}: "
                f"{result.reason})"
            )
    for cid in record.hard_failed:
        failures = record.candidates[cid].failures
        names = " and ".join(g.gate for g in failures)
        reasons = "; ".join(g.reason for g in failures)
        triggers.append(f"{cid}: {names} no longer FAIL ({reasons})")
    if record.chosen is not None:
        triggers.append(f"{record.chosen}: any gate evidence of the chosen candidate changes")
    return tuple(triggers)
