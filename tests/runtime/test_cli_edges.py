"""``kubemoot place`` refuses a model the snapshot knows nothing about (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUEUE = ROOT / "examples" / "place" / "worked-example-queue.yaml"
KUBEMOOT = Path(sys.executable).with_name("kubemoot")

# A model known only from a ticket loading it, and one only declared (no copy anywhere).
SNAPSHOT = """\
apiVersion: kubemoot.ai/v1alpha1
kind: PlacementState
now: "2026-05-15T12:00:00Z"
models: [{name: "declared:7b", vramMiB: 4096}]
providers:
- name: gpu
  totalVramMiB: 24576
  maxParallel: 2
  tickets:
  - {model: "loading:3b", state: loading, startedAt: "2026-05-15T11:59:59Z", footprintMiB: 2048}
"""


def place(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBEMOOT), "place", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)


@pytest.mark.parametrize(
    ("args", "flag", "model"),
    [
        (["--model", "nosuch:model"], "--model", "nosuch:model"),
        (["--model", "qwen3:14b", "--candidates",
          '[{"model": "qwen3:14b", "score": 50}, {"model": "typo:8b", "score": 40}]'],
         "--candidates", "typo:8b"),
    ],
)
def test_an_unknown_model_is_bad_input(args: list[str], flag: str, model: str) -> None:
    done = place("-f", str(QUEUE), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"field {flag}: '{model}' is not declared in {QUEUE}" in done.stderr
    assert "no provider holds it" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize(("model", "action"), [("loading:3b", "loading"),
                                               ("declared:7b", "cold-load")])
def test_a_model_known_from_a_ticket_or_a_declaration_still_places(
    tmp_path: Path, model: str, action: str
) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(SNAPSHOT)
    done = place("-f", str(state), "--model", model, "-o", "json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["action"], out["model"]) == (action, model)


def test_a_resident_model_is_not_refused() -> None:
    done = place("-f", str(QUEUE), "--model", "qwen3:32b", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["action"] == "warm"
