"""``kubemoot decide`` end to end, in a subprocess like a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "examples" / "decide" / "case-1-baseline.yaml"


def kubemoot(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("kubemoot")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "kubemoot.cli"]
    return subprocess.run(
        [*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_json_output_matches_the_documented_shape() -> None:
    done = kubemoot("decide", "-f", str(BASELINE), "-o", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["kind"] == "PlacementDecision"
    assert doc["recordVersion"] == "v1"
    assert doc["workloadId"] == "W-GPU-7"
    assert doc["outcome"] == "PLACE"
    assert doc["node"] == "N3"
    assert doc["feasible"] == ["N3"]
    assert doc["uncertain"] == []
    assert doc["hardFailed"] == ["N1", "N2"]
    assert doc["gates"]["N1"]["memory"]["result"] == "FAIL"
    assert doc["gates"]["N2"]["artifact"]["result"] == "FAIL"
    assert set(doc["gates"]["N1"]["memory"]) >= {"result", "reason", "evidence"}
    assert list(doc["scores"]) == ["N3"]
    assert isinstance(doc["scores"]["N3"], float)
    for key in ("schedulerVersion", "scoringPolicyVersion", "reason"):
        assert isinstance(doc[key], str) and doc[key]
    assert isinstance(doc["recheckTriggers"], list) and doc["recheckTriggers"]


def test_yaml_output_and_exit_zero_for_defer() -> None:
    path = ROOT / "examples" / "decide" / "defer-unknown-memory.yaml"
    done = kubemoot("decide", "-f", str(path), "-o", "yaml")
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(done.stdout)
    assert doc["outcome"] == "DEFER"
    assert doc["node"] is None


def test_table_explains_the_decision() -> None:
    done = kubemoot("decide", "-f", str(BASELINE))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "PLACE" in out and "N3" in out
    assert "N1 memory FAIL: 16 GiB < 24 GiB required" in out
    assert "QUARANTINED" in out
    assert "Recheck when" in out


BROKEN = {
    "unknown field": (
        lambda text: text.replace("    memoryGiB: 16\n", "    memoryGB: 16\n"),
        "field spec.nodes[0].memoryGB",
    ),
    "broken yaml": (lambda text: text + "  - name: [\n", "YAML syntax error at line"),
    "wrong kind": (
        lambda text: text.replace("kind: PlacementRequest", "kind: Model"),
        "field kind",
    ),
    "bad value": (lambda text: text.replace("memoryGiB: 16", "memoryGiB: lots"), "memoryGiB"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_bad_file_exits_2_naming_file_and_field(tmp_path: Path, case: str) -> None:
    mutate, must_name = BROKEN[case]
    bad = tmp_path / "broken.yaml"
    bad.write_text(mutate(BASELINE.read_text(encoding="utf-8")), encoding="utf-8")
    done = kubemoot("decide", "-f", str(bad), "-o", "json")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    assert "broken.yaml" in done.stderr
    assert must_name in " ".join(done.stderr.split())  # rich may wrap a long line
    assert done.stdout == ""


def test_missing_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    done = kubemoot("decide", "-f", str(missing))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "nope.yaml" in done.stderr


def test_request_from_stdin() -> None:
    exe = Path(sys.executable).with_name("kubemoot")
    done = subprocess.run(
        [str(exe), "decide", "-f", "-", "-o", "json"],
        input=BASELINE.read_text(encoding="utf-8"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["node"] == "N3"
