"""The decision record of one per-call placement (capability-aware record v1).

Candidates are ``provider/model`` pairs (and ``provider/model (unload)`` for eviction
plans) with the gate results the filters produced; each candidate's standing comes from the
gates' one rule (:func:`kubemoot.gates.standing`). The "score" of a feasible candidate
is its cost in seconds — lower wins — so the ranked list reads cheapest first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubemoot.gates.record import CandidateResult, DecisionRecord
from kubemoot.gates.results import GateResult, Outcome, Standing, standing
from kubemoot.runtime.cost import Option, OptionKind

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
