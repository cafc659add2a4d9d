"""``kubemoot decide``: every number of a PlacementRequest has a bound, and every problem
of a document is named, not counted."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubemoot.api.bounds import MAX_COUNT, MAX_GIB, MAX_ITEMS, MAX_SECONDS
from tests.api.cli_run import assert_refused, run_cli, with_value

REQUEST: dict[str, Any] = {
    "apiVersion": "kubemoot.ai/v1alpha1",
    "kind": "PlacementRequest",
    "metadata": {"name": "bounds"},
    "spec": {
        "now": "2026-05-15T12:00:00Z",
        "freshness": {"maxAgeSeconds": 300},
        "workload": {"id": "w", "memoryGiB": 24},
        "nodes": [{
            "name": "n1", "observedAt": "2026-05-15T11:59:00Z", "accelerator": "H100",
            "memoryGiB": 80, "labels": {"rack": 1.5},
            "telemetry": {"utilization": 0.5, "queueDepth": 3},
        }],
    },
}
# (field path, a value just inside, a value just outside)
FIELDS: list[tuple[str, Any, Any]] = [
    ("spec.freshness.maxAgeSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001),
    ("spec.freshness.maxAgeSeconds", 0.001, 0),
    ("spec.workload.memoryGiB", MAX_GIB, MAX_GIB + 0.5),
    ("spec.workload.memoryGiB", 0, -0.5),
    ("spec.nodes[0].memoryGiB", MAX_GIB, MAX_GIB + 0.5),
    ("spec.nodes[0].telemetry.utilization", 1, 1.01),
    ("spec.nodes[0].telemetry.queueDepth", MAX_COUNT, MAX_COUNT + 1),
]


def _decide(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, Any]) -> Any:
    file = tmp_path / "request.yaml"
    file.write_text(yaml.safe_dump(doc, sort_keys=False))
    return run_cli(["decide", "-f", str(file), "-o", "json"], capsys)


@pytest.mark.parametrize(("path", "inside", "outside"), FIELDS,
                         ids=[f"{p}={o}" for p, _, o in FIELDS])
def test_each_request_number_has_a_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, inside: Any, outside: Any
) -> None:
    done = _decide(tmp_path, capsys, with_value(REQUEST, path, inside))
    assert done.code == 0, done.stderr
    done = _decide(tmp_path, capsys, with_value(REQUEST, path, outside))
    assert_refused(done, "request.yaml", "PlacementRequest/bounds", f"field {path}")


@pytest.mark.parametrize("path", ["spec.freshness.maxAgeSeconds", "spec.workload.memoryGiB",
                                  "spec.nodes[0].memoryGiB", "spec.nodes[0].labels.rack",
                                  "spec.nodes[0].telemetry.utilization"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_infinity_and_nan_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, value: float
) -> None:
    done = _decide(tmp_path, capsys, with_value(REQUEST, path, value))
    assert_refused(done, f"field {path}")


def test_more_nodes_than_the_limit_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [{"name": f"n{i}"} for i in range(MAX_ITEMS + 1)]
    done = _decide(tmp_path, capsys, with_value(REQUEST, "spec.nodes", nodes))
    assert_refused(done, "field spec.nodes", f"at most {MAX_ITEMS} items")


def test_every_problem_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = with_value(REQUEST, "spec.workload.memoryGiB", -1)
    doc = with_value(doc, "spec.nodes[0].telemetry.queueDepth", -2)
    doc = with_value(doc, "spec.freshness.maxAgeSeconds", "soon")
    done = _decide(tmp_path, capsys, doc)
    assert_refused(done, "field spec.freshness.maxAgeSeconds", "'soon'",
                   "also spec.workload.memoryGiB:", "spec.nodes[0].telemetry.queueDepth:")
    assert "more problem" not in done.stderr


def test_a_misspelt_key_is_named_with_the_key_it_resembles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = with_value(REQUEST, "spec.workloads", REQUEST["spec"]["workload"])
    del doc["spec"]["workload"]
    done = _decide(tmp_path, capsys, doc)
    assert_refused(done, 'field spec.workloads: unknown field; did you mean "workload"?',
                   "spec.workload: required field is missing")
