"""Properties of ``decide`` over random requests."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.capability import decide, parse_request
from kubemoot.gates import Outcome, Verdict
from tests.capability._build import DIGEST, document, node

TIMES = ["2026-05-15T11:59:00Z", "2026-05-15T11:50:00Z", "2026-05-15T10:00:00Z"]


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


replicas = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["media-model", "other"]),
            "digest": st.sampled_from([DIGEST, "sha256:OLD"]),
            "state": st.sampled_from(["VERIFIED", "QUARANTINED", "PENDING"]),
        }
    ),
    max_size=2,
)
node_fields = {
    "observedAt": maybe(st.sampled_from(TIMES)),
    "accelerator": maybe(st.sampled_from(["H100", "L40S", "A10"])),
    "memoryGiB": maybe(st.sampled_from([8, 16, 24, 48])),
    "runtimes": maybe(st.lists(st.sampled_from(["R1", "R2", "R3"]), max_size=2)),
    "artifacts": maybe(replicas),
    "license": maybe(st.sampled_from(["ALLOW", "REVIEW_REQUIRED", "BLOCKED"])),
    "policy": maybe(st.fixed_dictionaries({"egress": st.sampled_from(["none", "allowed"])})),
    "labels": maybe(st.just({"accelerator": "h100"})),
    "telemetry": maybe(
        st.fixed_dictionaries(
            {
                "utilization": st.floats(0, 1, allow_nan=False),
                "queueDepth": st.integers(0, 20),
            }
        )
    ),
}


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(0, 5))
    nodes = []
    for index in range(count):
        if draw(st.booleans()):
            # A qualifying node with a few fields changed: exercises PLACE and near misses.
            data = node(f"N{index}")
            changed = draw(st.lists(st.sampled_from(list(node_fields)), max_size=2, unique=True))
        else:
            data = {"name": f"N{index}"}
            changed = list(node_fields)
        for key in changed:
            value = draw(node_fields[key])
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        nodes.append(data)
    work: dict[str, Any] = {"license": "ALLOW"}  # the only requirement a contract may hold
    if draw(st.booleans()):
        work["policy"] = {"egress": "allowed"}
    return document(*nodes, max_age=600, **work)


@settings(max_examples=150, deadline=None)
@given(data=requests())
def test_decision_invariants(data: dict[str, Any]) -> None:
    record = decide(parse_request(data))
    verdicts = {name: {g.result for g in cand.gates} for name, cand in record.candidates.items()}
    chosen = record.chosen
    if chosen is not None:
        assert verdicts[chosen] == {Verdict.PASS}  # never a FAIL, UNKNOWN or STALE node
        best = max(record.scores.values())
        assert record.scores[chosen] == best
        assert chosen == min(n for n, s in record.scores.items() if s == best)
        _assert_really_qualified(data, chosen)
    for name, seen in verdicts.items():
        if Verdict.FAIL in seen:
            assert name in record.hard_failed
        elif seen - {Verdict.PASS}:
            assert name in record.uncertain
        else:
            assert name in record.feasible
    assert set(record.scores) == set(record.feasible)  # scores for feasible nodes only
    assert (record.outcome is Outcome.DEFER) == (not record.feasible and bool(record.uncertain))
    assert (record.outcome is Outcome.PLACE) == bool(record.feasible)
    assert (chosen is None) == (record.outcome is not Outcome.PLACE)


def _assert_really_qualified(data: dict[str, Any], chosen: str) -> None:
    """An oracle written from the spec's words, independent of the gate code."""
    spec = data["spec"]
    work = spec["workload"]
    (placed,) = [n for n in spec["nodes"] if n["name"] == chosen]
    assert placed["observedAt"] in TIMES[:2]  # dated and within 600 s
    assert placed["accelerator"] in work["accelerators"]
    assert placed["memoryGiB"] >= work["memoryGiB"]
    assert work["runtime"] in placed["runtimes"]
    license = placed["license"]
    assert license == "ALLOW"
    if work["policy"]["egress"] == "none":
        assert placed["policy"]["egress"] == "none"
    for replica in placed["artifacts"]:
        if replica["name"] == "media-model" or replica["digest"] == DIGEST:
            assert (replica["digest"], replica["state"]) == (DIGEST, "VERIFIED")
