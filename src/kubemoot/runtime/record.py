"""The decision record of one per-call placement (capability-aware record v1).

Candidates are ``provider/model`` pairs (and ``provider/model (unload)`` for eviction
plans) with the gate results the filters produced; each candidate's standing comes from the
gates' one rule (:func:`kubemoot.gates.standing`). The "score" of a feasible candidate
is its cost in seconds — lower wins — so the ranked list reads cheapest first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubemoot.gates.record import CandidateResult, DecisionRecord
from kubemoot.gates.results import GateResult, Outcome, Standing, standing
from kubemoot.runtime.cost import Option, OptionKind
from kubemoot.runtime.placement import CallPlacement

SCHEDULER_VERSION = "kubemoot-runtime/0.1"
SCORING_POLICY_VERSION = "call-cost-seconds/v1 (lower wins)"
RECHECK_TRIGGERS = (
    "provider state published (probe)",
    "ticket claimed or released",
    "demand board changed (waiters, intents, use)",
)


def option_id(option: Option) -> str:
    suffix = " (unload)" if option.kind is OptionKind.UNLOAD else ""
    return f"{option.provider}/{option.model}{suffix}"


def build_record(
    *,
    subject: str,
    gates: Mapping[str, list[GateResult]],
    options: Sequence[Option],
    chosen: Option | None,
    outcome: Outcome,
    reason: str,
) -> DecisionRecord:
    candidates = {
        cid: CandidateResult(cid, standing(results), tuple(results))
        for cid, results in gates.items()
    }
    ranked = tuple(dict.fromkeys(option_id(o) for o in options))
    scores = {option_id(o): o.seconds for o in reversed(options)}
    by_standing: dict[Standing, list[str]] = {s: [] for s in Standing}
    for cid, cand in candidates.items():
        by_standing[cand.standing].append(cid)
    return DecisionRecord(
        subject=subject,
        scheduler_version=SCHEDULER_VERSION,
        scoring_policy_version=SCORING_POLICY_VERSION,
        outcome=outcome,
        chosen=option_id(chosen) if chosen is not None else None,
        feasible=tuple(sorted(by_standing[Standing.FEASIBLE])),
        uncertain=tuple(sorted(by_standing[Standing.UNCERTAIN])),
        hard_failed=tuple(sorted(by_standing[Standing.HARD_FAILED])),
        candidates=candidates,
        ranked=ranked,
        scores={cid: scores[cid] for cid in ranked},
        score_breakdown={cid: {"seconds": scores[cid]} for cid in ranked},
        weights={"seconds": 1.0},
        reason=reason,
        recheck_triggers=RECHECK_TRIGGERS,
    )


#: How much of a placement's decision travels with its call record. The full record of
#: a busy fleet lists every provider × model option and all their gates; the call log
#: keeps one document per call, so it keeps the cheapest options and the first
#: failures, and says how many it left out.
CALL_DECISION_OPTIONS = 8
CALL_DECISION_FAILURES = 8


def call_decision(placement: CallPlacement) -> dict[str, Any]:
    """The bounded summary of one placement that travels with its call record.

    What a person asks of one call: what it did (``action``), what it cost to choose
    (``options`` with their seconds, cheapest first), what was ruled out and why
    (``failedGates``), and whom it pushed out (``victims``). JSON-ready, camelCase.
    """
    options = sorted(placement.options, key=lambda o: o.seconds)
    failed: list[dict[str, Any]] = []
    record = placement.decision
    if record is not None:
        for cid, candidate in record.candidates.items():
            for gate in candidate.failures:
                failed.append({"candidate": cid, "gate": gate.gate, "reason": gate.reason})
    summary: dict[str, Any] = {
        "action": placement.action.value,
        "chosen": record.chosen if record is not None else None,
        "outcome": record.outcome.value if record is not None else None,
        "reason": placement.reason or (record.reason if record is not None else None),
        "victims": list(placement.evicted),
        "options": [o.to_dict() for o in options[:CALL_DECISION_OPTIONS]],
        "failedGates": failed[:CALL_DECISION_FAILURES],
    }
    left = {"options": len(options) - CALL_DECISION_OPTIONS,
            "failedGates": len(failed) - CALL_DECISION_FAILURES}
    if any(n > 0 for n in left.values()):
        summary["leftOut"] = {k: n for k, n in left.items() if n > 0}
    if record is not None:
        summary["schedulerVersion"] = record.scheduler_version
    return summary
