"""Whole decisions: outcomes, scoring policy, explanations and the output document."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from kubemoot.api.errors import InputError
from kubemoot.capability import (
    SCHEDULER_VERSION,
    SCORING_POLICY_VERSION,
    decide,
    decision_document,
    load_request,
    parse_request,
)
from kubemoot.gates import Outcome
from tests.capability._build import ABSENT, OLD, document, node, request

CASES: list[tuple[str, list[dict[str, Any]], Outcome, str | None]] = [
    ("no nodes", [], Outcome.UNSCHEDULABLE, None),
    ("one qualifying node", [node("N1")], Outcome.PLACE, "N1"),
    (
        "spec baseline",
        [
            node("N1", memoryGiB=16),
            node(
                "N2",
                artifacts=[
                    {"name": "media-model", "digest": "sha256:D-GPU", "state": "QUARANTINED"}
                ],
            ),
            node("N3", memoryGiB=24),
        ],
        Outcome.PLACE,
        "N3",
    ),
    ("unknown memory only", [node("N1", memoryGiB=ABSENT)], Outcome.DEFER, None),
    ("stale only", [node("N1", observedAt=OLD)], Outcome.DEFER, None),
    ("stale failure only", [node("N1", observedAt=OLD, memoryGiB=8)], Outcome.DEFER, None),
    ("undated only", [node("N1", observedAt=ABSENT)], Outcome.DEFER, None),
    (
        "FAIL beside UNKNOWN is decisive",
        [node("N1", memoryGiB=8, runtimes=ABSENT)],
        Outcome.UNSCHEDULABLE,
        None,
    ),
    (
        "all fail",
        [node("N1", license="BLOCKED"), node("N2", policy={"egress": "allowed"})],
        Outcome.UNSCHEDULABLE,
        None,
    ),
    (
        "feasible beats an idle uncertain node",
        [
            node("N1", memoryGiB=ABSENT, telemetry={"utilization": 0.0, "queueDepth": 0}),
            node("N2", telemetry={"utilization": 0.99, "queueDepth": 9}),
        ],
        Outcome.PLACE,
        "N2",
    ),
]


@pytest.mark.parametrize(
    ("nodes", "outcome", "chosen"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_outcomes(nodes: list[dict[str, Any]], outcome: Outcome, chosen: str | None) -> None:
    record = decide(request(*nodes))
    assert record.outcome is outcome, record.reason
    assert record.chosen == chosen


def test_verified_locality_wins_with_equal_load() -> None:
    record = decide(request(node("N1", artifacts=[]), node("N2")))
    assert record.chosen == "N2"
    assert record.score_breakdown["N2"]["locality"] == 100.0
    assert record.score_breakdown["N1"]["locality"] == 0.0


def test_equal_nodes_tie_by_name() -> None:
    assert decide(request(node("N2"), node("N1"))).ranked == ("N1", "N2")


@pytest.mark.parametrize(
    ("telemetry", "queue", "utilization"),
    [
        ({"utilization": 0.0, "queueDepth": 0}, 100.0, 100.0),
        ({"utilization": 0.25, "queueDepth": 3}, 25.0, 75.0),
        ({"utilization": 1.0}, 0.0, 0.0),
        (ABSENT, 0.0, 0.0),  # unmeasured earns nothing
    ],
)
def test_load_scores(telemetry: Any, queue: float, utilization: float) -> None:
    record = decide(request(node("N1", telemetry=telemetry)))
    breakdown = record.score_breakdown["N1"]
    assert breakdown["queueDepth"] == pytest.approx(queue)
    assert breakdown["utilization"] == pytest.approx(utilization)
    expected = 0.4 * 100 + 0.3 * queue + 0.3 * utilization
    assert record.scores["N1"] == pytest.approx(expected)


def test_decision_document_shape() -> None:
    req = request(node("N1", memoryGiB=16), node("N2", memoryGiB=ABSENT), node("N3"))
    doc = decision_document(req, decide(req))
    json.dumps(doc)
    yaml.safe_dump(doc)
    assert doc["kind"] == "PlacementDecision"
    assert doc["recordVersion"] == "v1"
    assert doc["workloadId"] == "W-GPU-7"
    assert doc["outcome"] == "PLACE"
    assert doc["node"] == "N3"
    assert (doc["feasible"], doc["uncertain"], doc["hardFailed"]) == (["N3"], ["N2"], ["N1"])
    assert set(doc["gates"]) == {"N1", "N2", "N3"}
    memory = doc["gates"]["N1"]["memory"]
    assert memory["result"] == "FAIL"
    assert memory["evidence"] == {"requiredGiB": 24, "declaredGiB": 16}
    assert set(doc["gates"]["N3"]) == {
        "artifact",
        "runtime",
        "accelerator",
        "memory",
        "license",
        "policy",
        "freshness",
    }
    assert list(doc["scores"]) == ["N3"]
    assert doc["schedulerVersion"] == SCHEDULER_VERSION
    assert doc["scoringPolicyVersion"] == SCORING_POLICY_VERSION
    assert "N1 fails memory" in doc["reason"]
    assert any("N2 publishes memoryGiB" in t for t in doc["recheckTriggers"])
    assert doc["now"] == "2026-05-15T12:00:00Z"


def test_defer_reason_and_refresh_trigger() -> None:
    record = decide(request(node("N3", observedAt=OLD)))
    assert record.outcome is Outcome.DEFER
    assert "stale" in record.reason
    assert any(t.startswith("refresh of N3's capability evidence") for t in record.recheck_triggers)


def test_place_names_when_the_chosen_evidence_expires() -> None:
    record = decide(request(node("N1")))
    assert "N1's evidence turns STALE at 2026-05-15T12:04:00Z unless refreshed" in (
        record.recheck_triggers
    )


def test_now_falls_back_to_the_given_time_and_is_required() -> None:
    req = request(node("N1", observedAt=OLD), now=None)
    assert decide(req, now=datetime(2026, 5, 15, 11, 1, tzinfo=UTC)).outcome is Outcome.PLACE
    with pytest.raises(InputError) as caught:
        decide(req)
    assert caught.value.field == "spec.now"


def test_default_max_age_is_120_seconds() -> None:
    req = request(node("N1", observedAt="2026-05-15T11:57:59Z"), max_age=None)
    assert decide(req).outcome is Outcome.DEFER


BAD = [
    (
        "unknown node field",
        {"spec": {"nodes": [{"name": "N1", "memoryGB": 16}]}},
        "spec.nodes[0].memoryGB",
        "unknown field",
    ),
    (
        "unknown workload field",
        {"spec": {"workload": {"id": "W", "gpu": "good"}}},
        "spec.workload.gpu",
        "unknown field",
    ),
    (
        "bad license",
        {"spec": {"nodes": [{"name": "N1", "license": "MAYBE"}]}},
        "spec.nodes[0].license",
        "ALLOW",
    ),
    (
        "blocked cannot be required",
        {"spec": {"workload": {"id": "W", "license": "BLOCKED"}}},
        "spec.workload.license",
        "ALLOW",
    ),
    (
        "utilization above 1",
        {"spec": {"nodes": [{"name": "N1", "telemetry": {"utilization": 5}}]}},
        "spec.nodes[0].telemetry.utilization",
        "less than or equal",
    ),
    ("missing workload", {"spec": {"workload": ABSENT}}, "spec.workload", "required"),
    ("bad time", {"spec": {"now": "yesterday"}}, "spec.now", ""),
    ("wrong kind", {"kind": "Model"}, "kind", "PlacementRequest"),
    (
        "duplicate node",
        {"spec": {"nodes": [{"name": "N1"}, {"name": "N1"}]}},
        "spec.nodes",
        "more than once",
    ),
]


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    for key, value in change.items():
        if value is ABSENT:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict) and key != "workload":
            _merge(base[key], value)
        else:
            base[key] = value
    return base


@pytest.mark.parametrize(("change", "field", "text"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_field(change: dict[str, Any], field: str, text: str) -> None:
    data = _merge(document(node("N1")), change)
    with pytest.raises(InputError) as caught:
        parse_request(data, file="req.yaml", document=0)
    error = caught.value
    assert error.field == field
    assert error.file == "req.yaml"
    assert text in error.message
    assert "req.yaml" in error.describe() and field in error.describe()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [", "YAML syntax error at line"),
        ("", "found 0"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("kind: PlacementRequest\n---\nkind: PlacementRequest\n", "found 2"),
    ],
)
def test_load_request_errors(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        load_request(text, file="x.yaml")
    assert caught.value.file == "x.yaml"


def test_decision_document_records_the_license_and_policy_authority() -> None:
    from kubemoot.capability import decide, decision_document, parse_request
    from tests.capability._build import document, node

    data = document(node("N1"))
    data["spec"]["authority"] = {"source": "licence-registry/AIE-015", "version": "2026-05-01"}
    request = parse_request(data)
    recorded = decision_document(request, decide(request))
    assert recorded["authority"] == {"source": "licence-registry/AIE-015",
                                     "version": "2026-05-01"}
    bare = parse_request(document(node("N1")))
    assert decision_document(bare, decide(bare))["authority"] is None
