"""Decision record v1: what was decided, over which evidence, and what would change it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubemoot.gates.results import GateResult, Outcome, Standing, Verdict

__all__ = ["RECORD_VERSION", "CandidateResult", "DecisionRecord"]

RECORD_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """Every gate result of one candidate, in gate order, and where that leaves it."""

    id: str
    standing: Standing
    gates: tuple[GateResult, ...]

    @property
    def failures(self) -> tuple[GateResult, ...]:
        """The gates that FAILed: why the candidate is out."""
        return tuple(g for g in self.gates if g.result is Verdict.FAIL)

    @property
    def unresolved(self) -> tuple[GateResult, ...]:
        """The UNKNOWN or STALE gates that do not admit: what the candidate waits on."""
        return tuple(g for g in self.gates if g.waits)

    def gate(self, name: str) -> GateResult | None:
        """The result of the named gate, or None when it was not evaluated."""
        for result in self.gates:
            if result.gate == name:
                return result
        return None


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """The auditable result of one placement decision (record version ``v1``).

    ``candidates`` keeps the input order; the id tuples are sorted; ``ranked`` lists the
    feasible candidates best first (score, then tie-break); ``scores`` and
    ``score_breakdown`` (raw, unweighted scorer outputs) exist for feasible candidates only.
    """

    subject: str
    scheduler_version: str
    scoring_policy_version: str
    outcome: Outcome
    chosen: str | None
    feasible: tuple[str, ...]
    uncertain: tuple[str, ...]
    hard_failed: tuple[str, ...]
    candidates: Mapping[str, CandidateResult]
    ranked: tuple[str, ...]
    scores: Mapping[str, float]
    score_breakdown: Mapping[str, Mapping[str, float]]
    weights: Mapping[str, float]
    reason: str
    recheck_triggers: tuple[str, ...]
    record_version: str = RECORD_VERSION

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data with camelCase keys."""
        return {
            "recordVersion": self.record_version,
            "schedulerVersion": self.scheduler_version,
            "scoringPolicyVersion": self.scoring_policy_version,
            "subject": self.subject,
            "outcome": self.outcome.value,
            "chosen": self.chosen,
            "feasible": list(self.feasible),
            "uncertain": list(self.uncertain),
            "hardFailed": list(self.hard_failed),
            "gates": {
                cid: {g.gate: g.to_dict() for g in cand.gates}
                for cid, cand in self.candidates.items()
            },
            "ranked": list(self.ranked),
            "scores": {cid: round(self.scores[cid], 6) for cid in self.ranked},
            "scoreBreakdown": {
                cid: {name: round(raw, 6) for name, raw in self.score_breakdown[cid].items()}
                for cid in self.ranked
            },
            "weights": dict(self.weights),
            "reason": self.reason,
            "recheckTriggers": list(self.recheck_triggers),
        }
