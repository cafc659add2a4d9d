"""``kubemoot simulate`` as a user runs it: a subprocess, files on disk, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KUBEMOOT = [sys.executable, "-c", "from kubemoot.cli import main; main()"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KUBEMOOT, *args], capture_output=True, text=True, timeout=120)


def test_simulate_writes_a_report_and_non_empty_plots(scenarios: Path, tmp_path: Path) -> None:
    done = _run("simulate", "-f", str(scenarios / "tiny.yaml"), "--report", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "kubemoot" in done.stdout and "round-robin" in done.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert [p["policy"] for p in report["policies"]] == [
        "kubemoot", "static", "round-robin", "least-busy", "random", "herd-like"
    ]
    pngs = ["wait-cdf.png", "loads-evictions.png"] + [
        f"vram-{p['policy']}.png" for p in report["policies"]
    ]
    for name in pngs:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000


def test_json_output_with_chosen_policies_and_overrides(scenarios: Path) -> None:
    done = _run("simulate", "-f", str(scenarios / "scale.yaml"), "--policy", "kubemoot",
                "--policy", "herd-like", "--scale-down", "0.01", "--duration", "200",
                "--seed", "4", "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["seed"] == 4
    assert [p["policy"] for p in data["policies"]] == ["kubemoot", "herd-like"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "fastest"], "unknown policy 'fastest'"),
        (["--scale-down", "2"], "scale-down"),
    ],
)
def test_bad_flags_exit_2_with_one_line(scenarios: Path, args: list[str], needle: str) -> None:
    done = _run("simulate", "-f", str(scenarios / "tiny.yaml"), *args)
    assert done.returncode == 2
    assert needle in done.stderr and "Traceback" not in done.stderr


def test_a_bad_scenario_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: kubemoot.ai/v1alpha1\nkind: SimulationScenario\n"
                    "metadata: {name: bad}\nspec: {durationSeconds: -5}\n")
    done = _run("simulate", "-f", str(path))
    assert done.returncode == 2
    assert "spec.durationSeconds" in done.stderr and "Traceback" not in done.stderr
