"""Every verdict of every capability gate, one table per gate."""

from __future__ import annotations

from typing import Any

import pytest

from kubemoot.capability import NodeCandidate, capability_gates
from kubemoot.gates import GateResult, Verdict
from tests.capability._build import ABSENT, DIGEST, OLD, VERIFIED, document, node, request

P, F, U, S = Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN, Verdict.STALE


def check(gate: str, node_doc: dict[str, Any], **work: Any) -> GateResult:
    req = request(node_doc, **work)
    spec = req.spec
    assert spec.now is not None
    candidate = NodeCandidate.at(
        spec.nodes[0], now=spec.now, max_age_seconds=spec.freshness.max_age_seconds
    )
    (found,) = [g for g in capability_gates(spec.workload) if g.name == gate]
    return found.check(candidate)


def replica(state: str = "VERIFIED", digest: str = DIGEST, name: str = "media-model") -> dict:
    return {"name": name, "digest": digest, "state": state}


ARTIFACT_CASES = [
    ("verified exact replica", node(), {}, P, True),
    ("no artifact list at all", node(artifacts=ABSENT), {}, U, None),
    ("empty list: will be transferred", node(artifacts=[]), {}, P, False),
    ("only other artifacts", node(artifacts=[replica(name="x", digest="sha256:X")]), {}, P, False),
    ("quarantined", node(artifacts=[replica("QUARANTINED")]), {}, F, None),
    ("quarantined, any case", node(artifacts=[replica("quarantined")]), {}, F, None),
    ("digest mismatch", node(artifacts=[replica(digest="sha256:OLD")]), {}, F, None),
    ("unknown provenance", node(artifacts=[replica("PENDING")]), {}, F, None),
    (
        "a bad replica beside a good one",
        node(artifacts=[VERIFIED, replica(digest="sha256:OLD")]),
        {},
        F,
        None,
    ),
    ("same digest, other name", node(artifacts=[replica(name="alias")]), {}, P, True),
    ("workload names no artifact", node(artifacts=ABSENT), {"artifact": ABSENT}, P, False),
    ("stale evidence", node(observedAt=OLD), {}, S, None),
]


@pytest.mark.parametrize(
    ("node_doc", "work", "verdict", "locality"),
    [c[1:] for c in ARTIFACT_CASES],
    ids=[c[0] for c in ARTIFACT_CASES],
)
def test_artifact_gate(node_doc: dict, work: dict, verdict: Verdict, locality: bool | None) -> None:
    result = check("artifact", node_doc, **work)
    assert result.result is verdict, result.reason
    if locality is not None:
        assert result.evidence["locality"] is locality


@pytest.mark.parametrize(
    ("node_doc", "work", "verdict"),
    [
        (node(runtimes=["R2", "R3"]), {}, P),
        (node(runtimes=["R1", "R2"]), {}, F),
        (node(runtimes=[]), {}, F),
        (node(runtimes=ABSENT), {}, U),
        (node(runtimes=ABSENT), {"runtime": ABSENT}, P),
        (node(observedAt=OLD, runtimes=["R1"]), {}, S),
    ],
    ids=["declared", "other runtimes", "none declared", "absent", "no requirement", "stale"],
)
def test_runtime_gate(node_doc: dict, work: dict, verdict: Verdict) -> None:
    assert check("runtime", node_doc, **work).result is verdict


@pytest.mark.parametrize(
    ("node_doc", "work", "verdict"),
    [
        (node(accelerator="L40S"), {}, P),
        (node(accelerator="h100"), {}, P),
        (node(accelerator="A10"), {}, F),
        (node(accelerator=ABSENT, labels={"accelerator": "h100"}), {}, U),
        (node(accelerator=ABSENT), {"accelerators": ABSENT}, P),
        (node(observedAt=OLD), {}, S),
    ],
    ids=[
        "compatible",
        "case-insensitive",
        "incompatible",
        "label is no evidence",
        "no req",
        "stale",
    ],
)
def test_accelerator_gate(node_doc: dict, work: dict, verdict: Verdict) -> None:
    assert check("accelerator", node_doc, **work).result is verdict


@pytest.mark.parametrize(
    ("node_doc", "work", "verdict"),
    [
        (node(memoryGiB=24), {}, P),
        (node(memoryGiB=80), {}, P),
        (node(memoryGiB=16), {}, F),
        (node(memoryGiB=23.5), {}, F),
        (node(memoryGiB=ABSENT, telemetry={"utilization": 0.0, "queueDepth": 0}), {}, U),
        (node(memoryGiB=ABSENT), {"memoryGiB": ABSENT}, P),
        (node(observedAt=OLD, memoryGiB=16), {}, S),
    ],
    ids=[
        "exact",
        "more",
        "less",
        "fraction less",
        "absent (idle is no evidence)",
        "no req",
        "stale",
    ],
)
def test_memory_gate(node_doc: dict, work: dict, verdict: Verdict) -> None:
    assert check("memory", node_doc, **work).result is verdict


@pytest.mark.parametrize(
    ("declared", "required", "verdict"),
    [
        ("ALLOW", "ALLOW", P),
        ("REVIEW_REQUIRED", "ALLOW", F),
        ("BLOCKED", "ALLOW", F),
        (ABSENT, "ALLOW", U),
    ],
)
def test_license_gate(declared: Any, required: str, verdict: Verdict) -> None:
    assert check("license", node(license=declared), license=required).result is verdict


@pytest.mark.parametrize("weaker", ["REVIEW_REQUIRED", "BLOCKED"])
def test_a_workload_cannot_require_a_license_weaker_than_allow(weaker: str) -> None:
    from kubemoot.api.errors import InputError
    from kubemoot.capability import parse_request

    data = document(node(license=weaker), license=weaker)
    with pytest.raises(InputError) as caught:
        parse_request(data)
    message = caught.value.describe()
    assert "spec.workload.license" in message and "must require ALLOW" in message


def test_license_gate_stale() -> None:
    assert check("license", node(observedAt=OLD, license="BLOCKED")).result is S


@pytest.mark.parametrize(
    ("node_policy", "work_policy", "verdict"),
    [
        ({"egress": "none"}, {"egress": "none"}, P),
        ({"egress": "allowed"}, {"egress": "none"}, F),
        (ABSENT, {"egress": "none"}, U),
        ({}, {"egress": "none"}, U),
        ({"egress": "allowed"}, {"egress": "allowed"}, P),
        ({"egress": "allowed"}, ABSENT, P),
    ],
    ids=["no egress both", "conflict", "absent", "egress unset", "workload allows", "no req"],
)
def test_policy_gate(node_policy: Any, work_policy: Any, verdict: Verdict) -> None:
    assert check("policy", node(policy=node_policy), policy=work_policy).result is verdict


def test_policy_gate_stale() -> None:
    assert check("policy", node(observedAt=OLD, policy={"egress": "allowed"})).result is S


@pytest.mark.parametrize(
    ("observed", "verdict"),
    [
        ("2026-05-15T11:55:00Z", P),  # exactly the max age: still fresh
        ("2026-05-15T11:54:59Z", S),
        ("2026-05-15T12:00:30Z", P),  # clock skew, not staleness
        (ABSENT, U),
    ],
)
def test_freshness_gate(observed: Any, verdict: Verdict) -> None:
    assert check("freshness", node(observedAt=observed)).result is verdict


def test_stale_keeps_the_verdict_the_old_evidence_gave() -> None:
    result = check("memory", node(observedAt=OLD, memoryGiB=16))
    assert result.result is S
    assert result.evidence["verdictIfFresh"] == "FAIL"
    assert result.evidence["declaredGiB"] == 16
    assert result.evidence["ageSeconds"] == 3600
    assert result.observed_at == "2026-05-15T11:00:00Z"


def test_missing_evidence_stays_unknown_when_stale() -> None:
    assert check("memory", node(observedAt=OLD, memoryGiB=ABSENT)).result is U


def test_undated_evidence_keeps_its_verdicts() -> None:
    assert check("memory", node(observedAt=ABSENT, memoryGiB=16)).result is F
    assert check("memory", node(observedAt=ABSENT)).result is P
