"""``kubemoot schedule`` through a real process: exit codes, JSON shape, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOMELAB = str(ROOT / "examples" / "homelab")
NOW = "2026-05-15T12:00:00Z"


def kubemoot(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("kubemoot")), *args],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=ROOT,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_json_shape() -> None:
    done = kubemoot("schedule", "-f", HOMELAB, "--now", NOW, "-o", "json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schedulerVersion"].startswith("kubemoot-scheduler/")
    coordinator = next(a for a in document["agents"] if a["name"] == "coordinator")
    assert coordinator["namespace"] == "crew-homelab-pilot"
    mulling = coordinator["phases"]["mulling"]
    assert {k: mulling[k] for k in ("outcome", "model", "modelId", "provider", "endpoint")} == {
        "outcome": "PLACE",
        "model": "qwen3-32b",
        "modelId": "qwen3:32b",
        "provider": "rtx5090",
        "endpoint": "http://127.0.0.1:11434",
    }
    assert mulling["score"] == 270.0
    assert mulling["candidates"][0] == {"model": "qwen3:32b", "score": 70}
    assert mulling["decision"]["chosen"] == "qwen3-32b"
    assert mulling["decision"]["recordVersion"] == "v1"
    assert coordinator["env"]["KUBEMOOT_MODEL_MODEL"] == "qwen3:32b"
    assert coordinator["conditions"][0]["type"] == "Scheduled"
    assert document["events"] == []


def test_yaml_and_table_outputs() -> None:
    as_yaml = kubemoot("schedule", "-f", HOMELAB, "--now", NOW, "-o", "yaml")
    assert as_yaml.returncode == 0 and "schedulerVersion:" in as_yaml.stdout
    table = kubemoot("schedule", "-f", HOMELAB, "--now", NOW)
    assert table.returncode == 0
    for word in ("AGENT", "PHASE", "OUTCOME", "coordinator", "qwen3-32b", "PLACE"):
        assert word in table.stdout


def test_explain_prints_the_decision_records() -> None:
    done = kubemoot(
        "schedule", "-f", HOMELAB, "--now", NOW, "--explain", "crew-homelab-pilot/coordinator"
    )
    assert done.returncode == 0, done.stderr
    assert "phase mulling" in done.stdout and "phase triage" in done.stdout
    assert "TopologySpread FAIL" in done.stdout  # why triage left the 5090


def test_unschedulable_bundle_exits_0_and_prints_the_event(tmp_path: Path) -> None:
    bundle = tmp_path / "b.yaml"
    bundle.write_text(
        "apiVersion: kubemoot.ai/v1alpha1\nkind: Agent\nmetadata: {name: a, namespace: crew-a}\n"
    )
    done = kubemoot("schedule", "-f", str(bundle), "--now", NOW)
    assert done.returncode == 0, done.stderr
    assert "FailedScheduling" in done.stdout and "UNSCHEDULABLE" in done.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-f", "does-not-exist.yaml"], "does-not-exist.yaml"),
        (["-f", HOMELAB, "--now", "yesterday"], "--now"),
        (["-f", HOMELAB, "--now", "2026-05-15T12:00:00"], "time zone"),
        (["-f", HOMELAB, "--explain", "coordinator"], "NAMESPACE/AGENT"),
        (["-f", HOMELAB, "--explain", "crew-x/nobody"], "no Agent crew-x/nobody"),
    ],
)
def test_bad_input_exits_2_without_traceback(args: list[str], needle: str) -> None:
    done = kubemoot("schedule", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert needle in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_broken_resource_names_file_and_field(tmp_path: Path) -> None:
    bundle = tmp_path / "broken.yaml"
    bundle.write_text(
        "apiVersion: kubemoot.ai/v1alpha1\nkind: Model\nmetadata: {name: m}\n"
        "spec: {model: m, providerRef: p, vramMib: lots}\n"
    )
    done = kubemoot("schedule", "-f", str(bundle), "--now", NOW)
    assert done.returncode == 2
    assert "broken.yaml" in done.stderr and "vramMib" in done.stderr
    assert "Traceback" not in done.stderr



def test_misspelled_provider_ref_is_a_warning_on_stderr(tmp_path: Path) -> None:
    # In-process: the subprocess above may run another checkout's installed entry point.
    from typer.testing import CliRunner

    from kubemoot.cli import app

    typo = tmp_path / "typo.yaml"
    typo.write_text(
        "apiVersion: kubemoot.ai/v1alpha1\nkind: Model\n"
        "metadata: {name: qwen3-typo, labels: {params: 8B}}\n"
        "spec: {model: 'qwen3:8b', providerRef: rtx509, vramMib: 5120}\n",
        encoding="utf-8",
    )
    runner = CliRunner()
    done = runner.invoke(app, ["schedule", "-f", HOMELAB, "-f", str(typo), "--now", NOW,
                               "-o", "json"])
    assert done.exit_code == 0, done.output
    assert "warning: Model/qwen3-typo, field spec.providerRef" in done.stderr
    assert 'did you mean "rtx5090"' in done.stderr
    [warning] = json.loads(done.stdout)["warnings"]
    assert (warning["name"], warning["reason"]) == ("qwen3-typo", "ProviderNotFound")
    clean = runner.invoke(app, ["schedule", "-f", HOMELAB, "--now", NOW, "-o", "json"])
    assert "warning" not in clean.stderr
    assert "warnings" not in json.loads(clean.stdout)
