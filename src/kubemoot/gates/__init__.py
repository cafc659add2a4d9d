"""Typed gates and decision records: the one engine every placement decision uses.

A *gate* judges one candidate PASS / FAIL / UNKNOWN / STALE with evidence; a *scorer*
ranks feasible candidates; :func:`standing` is the one rule from a candidate's
results to its standing (any FAIL is out; UNKNOWN/STALE never coerced to PASS unless
the gate marked the result ``admits_unknown``; :func:`verdict_standing` is the same
rule over bare verdicts); :func:`evaluate` applies the rules
(hard gates first, scores only over feasible candidates) and
returns a :class:`DecisionRecord` with a bounded :class:`Outcome`
(PLACE / UNSCHEDULABLE / DEFER).

This package is pure and generic over the candidate type: it imports nothing else
of Kubemoot's, does no I/O and reads no clock.
"""

from __future__ import annotations

from kubemoot.gates.engine import ScoreRangeError, default_recheck_triggers, evaluate
from kubemoot.gates.protocols import Gate, Scorer, Weighted
from kubemoot.gates.record import RECORD_VERSION, CandidateResult, DecisionRecord
from kubemoot.gates.results import (
    GateResult,
    Outcome,
    Standing,
    Verdict,
    jsonable,
    standing,
    verdict_standing,
)

__all__ = [
    "RECORD_VERSION",
    "CandidateResult",
    "DecisionRecord",
    "Gate",
    "GateResult",
    "Outcome",
    "ScoreRangeError",
    "Scorer",
    "Standing",
    "Verdict",
    "Weighted",
    "default_recheck_triggers",
    "evaluate",
    "jsonable",
    "standing",
    "verdict_standing",
]
