"""GateResult constructors, verdicts and JSON form."""

from __future__ import annotations

import json
from itertools import product

import pytest

from kubemoot.gates import (
    CandidateResult,
    GateResult,
    Standing,
    Verdict,
    standing,
    verdict_standing,
)


@pytest.mark.parametrize(
    ("make", "verdict", "passed"),
    [
        (GateResult.pass_, Verdict.PASS, True),
        (GateResult.fail, Verdict.FAIL, False),
        (GateResult.unknown, Verdict.UNKNOWN, False),
        (GateResult.stale, Verdict.STALE, False),
    ],
)
def test_constructors_set_verdict_evidence_and_time(make, verdict, passed) -> None:
    result = make("memory", "why", observed_at="2026-05-15T12:00:00Z", haveGiB=16)
    assert result.gate == "memory"
    assert result.result is verdict
    assert result.reason == "why"
    assert dict(result.evidence) == {"haveGiB": 16}
    assert result.observed_at == "2026-05-15T12:00:00Z"
    assert result.passed is passed
    assert result.to_dict() == {
        "result": verdict.value,
        "reason": "why",
        "evidence": {"haveGiB": 16},
        "observedAt": "2026-05-15T12:00:00Z",
    }


def test_results_are_immutable_and_compare_by_value() -> None:
    first = GateResult.pass_("runtime", "R3 declared")
    assert first == GateResult.pass_("runtime", "R3 declared")
    assert first != GateResult.pass_("runtime", "R2 declared")
    with pytest.raises(AttributeError):
        first.reason = "changed"  # type: ignore[misc]


def test_to_dict_without_time_or_evidence() -> None:
    assert GateResult.unknown("accelerator", "not declared").to_dict() == {
        "result": "UNKNOWN",
        "reason": "not declared",
        "evidence": {},
    }


def test_evidence_becomes_plain_json_and_yaml_data() -> None:
    result = GateResult.fail("x", "r", seen=("a", "b"), verdict=Verdict.PASS, nested={"k": {1, 2}})
    data = result.to_dict()
    assert data["evidence"] == {"seen": ["a", "b"], "verdict": "PASS", "nested": {"k": [1, 2]}}
    assert type(data["evidence"]["verdict"]) is str  # yaml.safe_dump rejects str subclasses
    json.dumps(data)


P = GateResult.pass_("a", "ok")
F = GateResult.fail("b", "violated")
U = GateResult.unknown("c", "absent")
S = GateResult.stale("d", "old")
UA = GateResult.unknown("context", "absent, and that admits", admits=True)


@pytest.mark.parametrize(
    ("results", "where"),
    [
        pytest.param((), Standing.FEASIBLE, id="no-gates"),
        pytest.param((P,), Standing.FEASIBLE, id="pass"),
        pytest.param((P, UA), Standing.FEASIBLE, id="admitting-unknown"),
        pytest.param((P, U), Standing.UNCERTAIN, id="unknown"),
        pytest.param((S, UA), Standing.UNCERTAIN, id="stale-beside-admitting"),
        pytest.param((U, F), Standing.HARD_FAILED, id="fail-wins-over-unknown"),
        pytest.param((UA, F), Standing.HARD_FAILED, id="fail-wins-over-admitting"),
    ],
)
def test_the_standing_rule(results: tuple[GateResult, ...], where: Standing) -> None:
    assert standing(results) is where


def test_only_an_unknown_declared_admitting_admits() -> None:
    assert UA.admits and UA.admits_unknown and not UA.passed
    assert P.admits
    assert not (U.admits or S.admits or F.admits)
    assert U.waits and S.waits and not (UA.waits or P.waits or F.waits)
    # admitting is a property of an UNKNOWN, never a way to soften a FAIL or STALE
    with pytest.raises(ValueError, match=r"'b'.*admits_unknown.*FAIL"):
        GateResult("b", Verdict.FAIL, "violated", admits_unknown=True)


def test_an_admitting_unknown_is_not_something_the_candidate_waits_on() -> None:
    candidate = CandidateResult("n1", standing((U, UA)), (U, UA))
    assert candidate.unresolved == (U,)


@pytest.mark.parametrize("size", [0, 1, 2, 3])
def test_the_standing_of_bare_verdicts_is_the_standing_rule(size: int) -> None:
    for verdicts in product(list(Verdict), repeat=size):
        results = [GateResult(f"g{i}", v, "why") for i, v in enumerate(verdicts)]
        assert verdict_standing(verdicts) is standing(results), verdicts
