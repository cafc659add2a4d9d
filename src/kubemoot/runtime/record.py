"""The decision record of one per-call placement (capability-aware record v1).

Candidates are ``provider/model`` pairs (and ``provider/model (unload)`` for eviction
plans) with the gate results the filters produced; each candidate's standing comes from the
gates' one rule (:func:`kubemoot.gates.standing`). The "score" of a feasible candidate
is its cost in seconds — lower wins — so the ranked list reads cheapest first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from kubemoot.gates.record import CandidateResult, DecisionRecord
from kubemoot.gates.results import GateResult, Outcome, Standing, standing
from kubemoot.runtime.cost import Option, OptionKind
from kubemoot.runtime.placement import CallPlacement, DeferredRecord

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
    # Each option's id once (a record is built per call the call log keeps); the first
    # option of an id ranks it, and its score is that first option's seconds.
    ids = [option_id(o) for o in options]
    ranked = tuple(dict.fromkeys(ids))
    scores = {cid: o.seconds for cid, o in zip(reversed(ids), reversed(options), strict=True)}
    feasible: list[str] = []
    uncertain: list[str] = []
    hard_failed: list[str] = []
    by_standing = {Standing.FEASIBLE: feasible, Standing.UNCERTAIN: uncertain,
                   Standing.HARD_FAILED: hard_failed}
    for cid, cand in candidates.items():
        by_standing[cand.standing].append(cid)
    return DecisionRecord(
        subject=subject,
        scheduler_version=SCHEDULER_VERSION,
        scoring_policy_version=SCORING_POLICY_VERSION,
        outcome=outcome,
        chosen=option_id(chosen) if chosen is not None else None,
        feasible=tuple(sorted(feasible)),
        uncertain=tuple(sorted(uncertain)),
        hard_failed=tuple(sorted(hard_failed)),
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

_SECONDS = attrgetter("seconds")


def call_decision(placement: CallPlacement) -> dict[str, Any]:
    """The bounded summary of one placement that travels with its call record.

    What a person asks of one call: what it did (``action``), what it cost to choose
    (``options`` with their seconds, cheapest first), what was ruled out and why
    (``failedGates``), and whom it pushed out (``victims``). JSON-ready, camelCase.
    """
    # The record of every call the call log keeps passes here: enum members are read
    # as ``str`` (their values, without the enum's Python descriptor), the sort key is
    # C's, and the counts left out are compared directly.
    options = sorted(placement.options, key=_SECONDS)
    failed: list[dict[str, Any]] = []
    # A placed call's record is not built for this: what the summary reads of it comes
    # from the deferred record as it stands (the same facts the built record would hold).
    deferred = placement.explanation
    record: DeferredRecord | DecisionRecord | None
    if isinstance(deferred, DeferredRecord):
        record = deferred
        for cid, gate in deferred.failures():
            failed.append({"candidate": cid, "gate": gate.gate, "reason": gate.reason})
    else:
        record = placement.decision
        if record is not None:
            for cid, candidate in record.candidates.items():
                for gate in candidate.failures:
                    failed.append({"candidate": cid, "gate": gate.gate, "reason": gate.reason})
    summary: dict[str, Any] = {
        "action": str(placement.action),
        "chosen": record.chosen if record is not None else None,
        "outcome": str(record.outcome) if record is not None else None,
        "reason": placement.reason or (record.reason if record is not None else None),
        "victims": list(placement.evicted),
        "options": [o.to_dict() for o in options[:CALL_DECISION_OPTIONS]],
        "failedGates": failed[:CALL_DECISION_FAILURES],
    }
    left_options = len(options) - CALL_DECISION_OPTIONS
    left_failed = len(failed) - CALL_DECISION_FAILURES
    if left_options > 0 or left_failed > 0:
        left = {"options": left_options, "failedGates": left_failed}
        summary["leftOut"] = {k: n for k, n in left.items() if n > 0}
    if record is not None:
        summary["schedulerVersion"] = record.scheduler_version
    return summary
