"""GateResult constructors, verdicts and JSON form."""

from __future__ import annotations

import json

import pytest

from kubemoot.gates import GateResult, Verdict


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
