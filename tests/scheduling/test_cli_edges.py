"""``kubemoot schedule --explain``: each phase says what it bound once, in a boxed table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOMELAB = str(ROOT / "examples" / "homelab")
NOW = "2026-05-15T12:00:00Z"


def explain(target: str, *files: str) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kubemoot")), "schedule", "-f", *files,
         "--now", NOW, "--explain", target],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_phase_line_names_model_identifier_and_provider_once() -> None:
    out = explain("crew-homelab-pilot/coordinator", HOMELAB)
    assert "phase mulling: PLACE qwen3-32b (qwen3:32b) on rtx5090, score 270" in out
    assert "phase triage: PLACE qwen3-14b-rtx4090 (qwen3:14b) on rtx4090" in out
    assert "qwen3-32b qwen3-32b" not in out


def test_the_candidate_table_has_a_header_and_a_rule_and_whole_rows() -> None:
    # No side borders (they cost columns at 80), but a header, a rule under it, and
    # each candidate's row starting at the left edge.
    lines = explain("crew-homelab-pilot/coordinator", HOMELAB).splitlines()
    header = next(i for i, line in enumerate(lines) if "STANDING" in line)
    assert lines[header].startswith("MODEL")
    assert set(lines[header + 1].strip()) == {"─"}
    assert any(line.startswith("→ qwen3-32b ") for line in lines)


def test_a_phase_with_no_candidates_prints_no_empty_table(tmp_path: Path) -> None:
    bundle = tmp_path / "b.yaml"
    bundle.write_text(
        "apiVersion: kubemoot.ai/v1alpha1\nkind: Agent\nmetadata: {name: a, namespace: crew-a}\n"
    )
    out = explain("crew-a/a", str(bundle))
    assert "phase mulling: UNSCHEDULABLE 0/0 models are available" in out
    assert "STANDING" not in out
