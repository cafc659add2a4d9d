"""The decision engine: standings, outcomes, scoring rules, records."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pytest
import yaml

from kubemoot.gates import (
    DecisionRecord,
    GateResult,
    Outcome,
    ScoreRangeError,
    Standing,
    Verdict,
    Weighted,
    evaluate,
)


@dataclass(frozen=True)
class Cand:
    """A test candidate: a name, the verdict each gate gives it, and a score."""

    name: str
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    score: float = 50.0
    rank: int = 0


@dataclass
class TableGate:
    """Answers what the candidate says for this gate (PASS when it says nothing)."""

    name: str
    calls: list[str] = field(default_factory=list)

    def check(self, candidate: Cand, /) -> GateResult:
        self.calls.append(candidate.name)
        verdict = candidate.verdicts.get(self.name, Verdict.PASS)
        return GateResult(self.name, verdict, f"{self.name} says {verdict.value}")


class ScoreOf:
    name = "score"

    def score(self, candidate: Cand, /) -> float:
        return candidate.score


class Constant:
    def __init__(self, name: str, value: float, *, bounded: bool = True) -> None:
        self.name = name
        self.value = value
        self.bounded = bounded

    def score(self, candidate: Cand, /) -> float:
        return self.value


P, F, U, S = Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN, Verdict.STALE
GATES = ("a", "b", "c")


def decide(cands: list[Cand], **kwargs: object) -> DecisionRecord:
    options: dict[str, object] = {
        "key": lambda c: c.name,
        "gates": [TableGate(n) for n in GATES],
        "scorers": [Weighted(ScoreOf())],
        "subject": "W",
        "scheduler_version": "test/1",
        "scoring_policy_version": "score/1",
    }
    options.update(kwargs)
    return evaluate(cands, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("verdicts", "standing"),
    [
        ({}, Standing.FEASIBLE),
        ({"a": F}, Standing.HARD_FAILED),
        ({"a": U}, Standing.UNCERTAIN),
        ({"b": S}, Standing.UNCERTAIN),
        ({"a": U, "c": S}, Standing.UNCERTAIN),
        ({"a": U, "b": F}, Standing.HARD_FAILED),  # any FAIL wins over UNKNOWN
        ({"a": F, "c": S}, Standing.HARD_FAILED),
        ({"a": F, "b": F, "c": F}, Standing.HARD_FAILED),
    ],
)
def test_standing_of_one_candidate(verdicts: dict[str, Verdict], standing: Standing) -> None:
    record = decide([Cand("n1", verdicts)])
    assert record.candidates["n1"].standing is standing


@pytest.mark.parametrize(
    ("cands", "outcome", "chosen"),
    [
        pytest.param([], Outcome.UNSCHEDULABLE, None, id="no-candidates"),
        pytest.param([Cand("n1")], Outcome.PLACE, "n1", id="one-feasible"),
        pytest.param(
            [Cand("n1", {"a": F}), Cand("n2", {"b": U}), Cand("n3")],
            Outcome.PLACE,
            "n3",
            id="feasible-beats-uncertain",
        ),
        pytest.param([Cand("n1", {"a": F}), Cand("n2", {"b": U})], Outcome.DEFER, None, id="defer"),
        pytest.param([Cand("n1", {"c": S})], Outcome.DEFER, None, id="defer-stale"),
        pytest.param(
            [Cand("n1", {"a": F}), Cand("n2", {"b": F, "c": U})],
            Outcome.UNSCHEDULABLE,
            None,
            id="all-hard-failed",
        ),
    ],
)
def test_outcomes(cands: list[Cand], outcome: Outcome, chosen: str | None) -> None:
    record = decide(cands)
    assert record.outcome is outcome
    assert record.chosen == chosen


def test_sets_are_sorted_and_partition_the_candidates() -> None:
    cands = [Cand("z", {"a": F}), Cand("m"), Cand("b", {"b": U}), Cand("a")]
    record = decide(cands)
    assert record.feasible == ("a", "m")
    assert record.uncertain == ("b",)
    assert record.hard_failed == ("z",)
    assert list(record.candidates) == ["z", "m", "b", "a"]  # input order kept


def test_every_gate_is_evaluated_unless_stopping_at_first_fail() -> None:
    gates = [TableGate(n) for n in GATES]
    record = decide([Cand("n1", {"a": F, "b": F})], gates=gates)
    assert [g.gate for g in record.candidates["n1"].failures] == ["a", "b"]
    assert all(g.calls == ["n1"] for g in gates)

    gates = [TableGate(n) for n in GATES]
    record = decide([Cand("n1", {"a": F, "b": F})], gates=gates, stop_at_first_fail=True)
    assert [g.gate for g in record.candidates["n1"].gates] == ["a"]
    assert record.candidates["n1"].standing is Standing.HARD_FAILED
    assert gates[1].calls == [] and gates[2].calls == []


def test_scores_exist_for_feasible_candidates_only() -> None:
    cands = [
        Cand("bad", {"a": F}, score=100),
        Cand("maybe", {"a": U}, score=99),
        Cand("ok", score=1),
    ]
    record = decide(cands)
    assert set(record.scores) == {"ok"}
    assert set(record.score_breakdown) == {"ok"}
    assert record.chosen == "ok"


def test_weights_are_applied_and_recorded() -> None:
    scorers = [Weighted(Constant("x", 50), 0.5), Weighted(Constant("y", 10), 3.0)]
    record = decide([Cand("n1")], scorers=scorers)
    assert record.scores["n1"] == pytest.approx(55.0)
    assert record.score_breakdown["n1"] == {"x": 50.0, "y": 10.0}
    assert record.weights == {"x": 0.5, "y": 3.0}


def test_a_bare_scorer_counts_with_weight_one() -> None:
    record = decide([Cand("n1", score=42)], scorers=[ScoreOf()])
    assert record.scores["n1"] == 42.0


@pytest.mark.parametrize("value", [-0.1, 100.5, math.nan])
def test_a_bounded_scorer_out_of_range_raises(value: float) -> None:
    with pytest.raises(ScoreRangeError, match="'x'"):
        decide([Cand("n1")], scorers=[Weighted(Constant("x", value))])


def test_an_unbounded_scorer_may_leave_the_range() -> None:
    scorers = [Weighted(Constant("w", -250), bounded=False)]
    assert decide([Cand("n1")], scorers=scorers).scores["n1"] == -250
    bare = Constant("w", 400, bounded=False)
    assert decide([Cand("n1")], scorers=[bare]).scores["n1"] == 400


def test_the_range_is_not_checked_for_candidates_that_are_not_feasible() -> None:
    record = decide([Cand("n1", {"a": F}, score=-5)])
    assert record.outcome is Outcome.UNSCHEDULABLE


def test_ranking_by_score_then_id_then_custom_tie_break() -> None:
    cands = [Cand("c", score=10), Cand("b", score=20), Cand("a", score=10)]
    assert decide(cands).ranked == ("b", "a", "c")
    cands = [Cand("c", score=10, rank=0), Cand("a", score=10, rank=1)]
    assert decide(cands, tie_break=lambda c: c.rank).ranked == ("c", "a")


class PerName:
    def __init__(self, name: str, values: dict[str, float]) -> None:
        self.name = name
        self.values = values

    def score(self, candidate: Cand, /) -> float:
        return self.values[candidate.name]


def test_equal_sums_tie_exactly() -> None:
    # (0.1 + 0.2) + 0.3 and (0.3 + 0.2) + 0.1 differ in the last bit; still a tie → by id.
    scorers = [
        PerName("x", {"a": 0.3, "b": 0.1}),
        PerName("y", {"a": 0.2, "b": 0.2}),
        PerName("z", {"a": 0.1, "b": 0.3}),
    ]
    record = decide([Cand("b"), Cand("a")], scorers=scorers)
    assert record.scores["a"] == record.scores["b"]
    assert record.ranked == ("a", "b")


def test_duplicate_ids_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        decide([Cand("n1"), Cand("n1")])


def test_record_json_shape() -> None:
    cands = [Cand("n1", {"a": F}), Cand("n2", {"b": U}), Cand("n3", score=70)]
    data = decide(cands).to_dict()
    json.dumps(data)
    yaml.safe_dump(data)
    assert data["recordVersion"] == "v1"
    assert data["schedulerVersion"] == "test/1"
    assert data["scoringPolicyVersion"] == "score/1"
    assert data["subject"] == "W"
    assert data["outcome"] == "PLACE"
    assert data["chosen"] == "n3"
    assert (data["feasible"], data["uncertain"], data["hardFailed"]) == (["n3"], ["n2"], ["n1"])
    assert data["gates"]["n1"]["a"]["result"] == "FAIL"
    assert set(data["gates"]["n2"]) == {"a", "b", "c"}
    assert data["scores"] == {"n3": 70.0}
    assert data["scoreBreakdown"] == {"n3": {"score": 70.0}}
    assert data["reason"].startswith("n3 passed every gate")


def test_recheck_triggers_name_what_could_change_the_result() -> None:
    cands = [Cand("n1", {"a": F}), Cand("n2", {"b": U, "c": S})]
    record = decide(cands)
    assert record.outcome is Outcome.DEFER
    triggers = record.recheck_triggers
    assert any(t.startswith("n2: b evidence is supplied") for t in triggers)
    assert any(t.startswith("n2: c evidence is refreshed") for t in triggers)
    assert any(t.startswith("n1: a no longer FAIL") for t in triggers)
    assert decide([]).reason == "there are no candidates"
