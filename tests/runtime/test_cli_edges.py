"""``kubemoot place`` refuses a model the snapshot knows nothing about, and every number
out of its bound (exit 2)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubemoot.api.bounds import (
    MAX_CONTEXT_TOKENS,
    MAX_ITEMS,
    MAX_MIB,
    MAX_PARALLEL,
    MAX_RATE,
    MAX_SCORE,
    MAX_SECONDS,
)
from kubemoot.runtime.what_if import MAX_DEMAND_ENTRIES
from tests.api.cli_run import Outcome, assert_refused, run_cli, with_value

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


# ---------------------------------------------------------------------------- bounds

BOUNDED_STATE: dict[str, Any] = {
    "apiVersion": "kubemoot.ai/v1alpha1",
    "kind": "PlacementState",
    "now": "2026-05-15T12:00:00Z",
    "settings": {"loadRateMiBps": 1024, "unloadSeconds": 1, "defaultLatencySeconds": 30,
                 "reserveMiB": 1024, "candidateTolerance": 10},
    "models": [{"name": "m:7b", "vramMiB": 4096, "diskMiB": 4096}],
    "providers": [{
        "name": "gpu", "totalVramMiB": 24576, "reserveMiB": 1024, "maxParallel": 2,
        "contextLength": 8192, "latencySeconds": 20,
        "residents": [{"model": "m:7b", "sizeMiB": 4096, "contextLength": 8192}],
        "tickets": [{"model": "m:7b", "state": "running", "startedAt": "2026-05-15T11:59:55Z",
                     "footprintMiB": 0, "evicts": {"m:7b": 0}}],
    }],
    "demand": {"m:7b": {"waiters": 1, "intents": 1, "recentUse": 1, "prediction": 1,
                        "lastUsedAt": "2026-05-15T11:59:00Z"}},
}
# (field path, a value just inside, a value just outside)
STATE_FIELDS: list[tuple[str, Any, Any]] = [
    ("settings.loadRateMiBps", MAX_RATE, MAX_RATE * 1.0001),
    ("settings.loadRateMiBps", 0.001, 0),
    ("settings.unloadSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001),
    ("settings.defaultLatencySeconds", MAX_SECONDS, MAX_SECONDS * 1.0001),
    ("settings.reserveMiB", MAX_MIB, MAX_MIB + 1),
    ("settings.candidateTolerance", MAX_SECONDS, MAX_SECONDS * 1.0001),
    ("models[0].vramMiB", MAX_MIB, MAX_MIB + 1),
    ("models[0].diskMiB", MAX_MIB, MAX_MIB + 1),
    ("providers[0].totalVramMiB", MAX_MIB, MAX_MIB + 1),
    ("providers[0].reserveMiB", MAX_MIB, MAX_MIB + 1),
    ("providers[0].maxParallel", MAX_PARALLEL, MAX_PARALLEL + 1),
    ("providers[0].contextLength", MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS + 1),
    ("providers[0].latencySeconds", MAX_SECONDS, MAX_SECONDS * 1.0001),
    ("providers[0].residents[0].sizeMiB", MAX_MIB, MAX_MIB + 1),
    ("providers[0].residents[0].contextLength", MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS + 1),
    ("providers[0].tickets[0].footprintMiB", MAX_MIB, MAX_MIB + 1),
    ("providers[0].tickets[0].evicts.m:7b", MAX_MIB, MAX_MIB + 1),
    ("demand.m:7b.waiters", MAX_DEMAND_ENTRIES - 1, MAX_DEMAND_ENTRIES + 1),
    ("demand.m:7b.intents", MAX_DEMAND_ENTRIES - 1, MAX_DEMAND_ENTRIES + 1),
    ("demand.m:7b.recentUse", MAX_RATE, MAX_RATE * 1.0001),
    ("demand.m:7b.prediction", MAX_RATE, MAX_RATE * 1.0001),
    ("demand.m:7b.lastUsedAt", "2026-05-14T12:00:00Z", "2026-05-14T11:59:59Z"),
]


def _place_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: dict[str, Any], *flags: str
) -> Outcome:
    file = tmp_path / "state.yaml"
    file.write_text(yaml.safe_dump(doc, sort_keys=False))
    return run_cli(["place", "-f", str(file), "--model", "m:7b", "-o", "json", *flags], capsys)


def _shown(path: str) -> str:
    """The loader's spelling of a path: a map key with ':' is bracketed."""
    return path.replace(".m:7b", "[m:7b]")


@pytest.mark.parametrize(("path", "inside", "outside"), STATE_FIELDS,
                         ids=[f"{p}={o}" for p, _, o in STATE_FIELDS])
def test_each_snapshot_number_has_a_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, inside: Any, outside: Any
) -> None:
    done = _place_state(tmp_path, capsys, with_value(BOUNDED_STATE, path, inside))
    assert done.code == 0, done.stderr
    done = _place_state(tmp_path, capsys, with_value(BOUNDED_STATE, path, outside))
    assert_refused(done, "state.yaml", "PlacementState", f"field {_shown(path)}")


def test_a_day_old_use_no_longer_overflows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two weeks back used to raise OverflowError from the decay factor (exit 1).
    doc = with_value(BOUNDED_STATE, "demand.m:7b.lastUsedAt", "2026-05-01T12:00:00Z")
    assert_refused(_place_state(tmp_path, capsys, doc), "field demand[m:7b].lastUsedAt",
                   "a day")


def test_demand_entries_are_bounded_over_all_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    half = MAX_DEMAND_ENTRIES // 2
    doc = with_value(BOUNDED_STATE, "demand", {
        "m:7b": {"waiters": half, "intents": 0},
        "other:1b": {"waiters": 0, "intents": half + 1},
    })
    assert_refused(_place_state(tmp_path, capsys, doc), "field demand[other:1b]",
                   f"more than {MAX_DEMAND_ENTRIES:,}")


@pytest.mark.parametrize("path", ["settings.unloadSeconds", "demand.m:7b.recentUse",
                                  "providers[0].latencySeconds"])
@pytest.mark.parametrize("value", [math.nan, math.inf, "1e400"])
def test_snapshot_infinity_and_nan_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, value: Any
) -> None:
    done = _place_state(tmp_path, capsys, with_value(BOUNDED_STATE, path, value))
    assert_refused(done, f"field {_shown(path)}", "finite number")


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--prompt-tokens", str(MAX_CONTEXT_TOKENS + 1)], "field --prompt-tokens"),
        (["--candidates", '[{"model": "m:7b", "score": NaN}]'], "field --candidates[0].score"),
        (["--candidates", '[{"model": "m:7b", "score": Infinity}]'],
         "field --candidates[0].score"),
        (["--candidates", '[{"model": "m:7b", "score": 1' + "0" * 400 + "}]"],
         "field --candidates[0].score"),
        (["--candidates", json.dumps([{"model": "m:7b"}] * (MAX_ITEMS + 1))],
         "field --candidates"),
    ],
)
def test_place_flags_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], field: str
) -> None:
    assert_refused(_place_state(tmp_path, capsys, BOUNDED_STATE, *flags), field)


def test_place_flags_at_their_bounds_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = _place_state(tmp_path, capsys, BOUNDED_STATE, "--prompt-tokens",
                        str(MAX_CONTEXT_TOKENS), "--candidates",
                        json.dumps([{"model": "m:7b", "score": MAX_SCORE}]))
    assert done.code == 0, done.stderr
