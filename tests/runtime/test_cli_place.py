"""`kubemoot place` through the real entry point, on the shipped examples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "place"
KUBEMOOT = [sys.executable, "-c", "from kubemoot.cli import main; main()"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KUBEMOOT, "place", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def place_json(*args: str) -> dict:
    done = run(*args, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_worked_example_queue() -> None:
    out = place_json("-f", str(EXAMPLES / "worked-example-queue.yaml"), "--model", "qwen3:14b")
    assert (out["action"], out["provider"], out["model"]) == ("queue", "rtx4090", "qwen3:14b")
    assert out["evicted"] == [] and out["reason"] is None
    assert out["options"] == [
        {"kind": "queue", "provider": "rtx4090", "model": "qwen3:14b", "seconds": 15.0,
         "victims": []},
        {"kind": "unload", "provider": "rtx5090", "model": "qwen3:14b", "seconds": 26.5,
         "victims": ["qwen3:32b"]},
    ]
    assert out["decision"]["outcome"] == "DEFER"


def test_worked_example_unload() -> None:
    out = place_json("-f", str(EXAMPLES / "worked-example-unload.yaml"), "--model", "qwen3:14b")
    assert (out["action"], out["provider"], out["evicted"]) == ("unload", "rtx4080", ["qwen3:8b"])
    seconds = {(o["kind"], o["provider"]): o["seconds"] for o in out["options"]}
    assert seconds == {("unload", "rtx4080"): 13.0, ("unload", "rtx5090"): 26.5,
                       ("queue", "rtx4090"): 95.0}
    assert out["decision"]["outcome"] == "PLACE"


@pytest.mark.parametrize(
    ("example", "args", "action", "reason"),
    [
        ("model-too-large.yaml", ["--model", "llama3.3:70b"], "refuse", "model-too-large"),
        ("prompt-too-large.yaml", ["--model", "qwen3:14b", "--prompt-tokens", "12000"],
         "refuse", "prompt-too-large"),
        ("prompt-too-large.yaml", ["--model", "qwen3:14b", "--prompt-tokens", "8000"],
         "cold-load", None),
        ("warm-candidate.yaml",
         ["--model", "qwen3:32b", "--candidates",
          '[{"model":"qwen3:32b","score":70},{"model":"qwen3:14b","score":60}]'],
         "warm", None),
    ],
)
def test_examples(example: str, args: list[str], action: str, reason: str | None) -> None:
    out = place_json("-f", str(EXAMPLES / example), *args)
    assert (out["action"], out["reason"]) == (action, reason)


def test_table_explains_the_choice() -> None:
    done = run("-f", str(EXAMPLES / "worked-example-queue.yaml"), "--model", "qwen3:14b")
    assert done.returncode == 0
    assert "queue" in done.stdout and "26.500" in done.stdout and "15.000" in done.stdout


def test_a_refusal_shows_the_numbers_behind_it() -> None:
    """The table said only "model is larger than the provider's usable VRAM"; how much
    larger was in the JSON alone."""
    done = run("-f", str(EXAMPLES / "model-too-large.yaml"), "--model", "llama3.3:70b")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # rich folds long lines
    assert "(occupancyMiB 40960, usableMiB 31744)" in text
    assert "(occupancyMiB 40960, usableMiB 23552)" in text


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("kind: PlacementState\nnow: 2026-05-15T12:00:00Z\nproviders: [{name: a, "
         "totalVramMiB: -5}]\n", "providers[0].totalVramMiB"),
        ("kind: PlacementState\nnow: 2026-05-15T12:00:00Z\nproviders: [{name: a, "
         "totalVRAM: 5}]\n", "providers[0].totalVRAM"),
        ("kind: PlacementState\nproviders: []\n", "now"),
        ("kind: PlacementState\nnow: 2026-05-15T12:00:00Z\nproviders: [{name: a, tickets: "
         "[{model: m, startedAt: 2026-05-15T12:10:00Z}]}]\n", "startedAt"),
    ],
)
def test_bad_snapshot_exits_2_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(text)
    done = run("-f", str(path), "--model", "m")
    assert done.returncode == 2
    assert field in done.stderr and "Traceback" not in done.stderr


def test_bad_candidates_exit_2() -> None:
    done = run("-f", str(EXAMPLES / "worked-example-queue.yaml"), "--model", "qwen3:14b",
               "--candidates", "[{\"score\": 3}]")
    assert done.returncode == 2 and "--candidates[0]" in done.stderr
