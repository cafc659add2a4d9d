"""``kubemoot simulate``: bad flags and unreadable files are exit 2 before any run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubemoot.api.errors import InputError
from kubemoot.cli.simulate import check_report_dir

KUBEMOOT = Path(sys.executable).with_name("kubemoot")


def simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBEMOOT), "simulate", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def assert_bad_input(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr
    assert done.stdout == ""  # refused up front: no comparison table was printed


@pytest.mark.parametrize(
    ("report", "needle"),
    [
        ("plain-file", "exists and is not a directory"),
        ("plain-file/sub", "plain-file is not a directory"),
        ("/proc/kubemoot-no-such-dir", "cannot write a report into"),
    ],
)
def test_an_unusable_report_directory_is_refused_before_the_run(
    scenarios: Path, tmp_path: Path, report: str, needle: str
) -> None:
    (tmp_path / "plain-file").write_text("taken")
    target = report if report.startswith("/") else str(tmp_path / report)
    done = simulate("-f", str(scenarios / "tiny.yaml"), "--report", target)
    assert_bad_input(done, "field --report", needle)


def test_the_report_check_leaves_no_trace(tmp_path: Path) -> None:
    check_report_dir(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "existing").mkdir()
    check_report_dir(tmp_path / "existing")
    assert list((tmp_path / "existing").iterdir()) == []


def test_the_report_check_names_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError) as caught:
        check_report_dir(tmp_path / "f")
    assert caught.value.field == "--report"


def test_a_folder_is_not_a_scenario(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text("kind: Model\n")
    assert_bad_input(simulate("-f", str(tmp_path)),
                     f"{tmp_path}: is a folder; give one SimulationScenario file")


def test_a_binary_scenario_file_is_not_utf8_text(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81 not text")
    assert_bad_input(simulate("-f", str(path)), f"{path}: not UTF-8 text")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--scale-down", "0"], "--scale-down"),
        (["--scale-down", "1.5"], "--scale-down"),
        (["--duration", "0"], "--duration"),
        (["--duration", "nan"], "--duration"),
        (["--duration", "inf"], "--duration"),
        (["--duration", "2592001"], "--duration"),  # past 30 days of virtual time
        (["--seed", "-1"], "--seed"),
        (["--seed", str(2**63)], "--seed"),
    ],
)
def test_bad_overrides_name_their_flag(scenarios: Path, args: list[str], flag: str) -> None:
    # Before the bounds, nan ran an empty simulation and inf one that never ended.
    done = simulate("-f", str(scenarios / "tiny.yaml"), *args)
    assert_bad_input(done, f"field {flag}:")
    assert "scaleDown" not in done.stderr and "durationSeconds" not in done.stderr


def test_a_duration_the_workload_limit_refuses_names_the_flag(scenarios: Path) -> None:
    # Inside 30 days, but scale.yaml would issue millions of calls in that time.
    done = simulate("-f", str(scenarios / "scale.yaml"), "--duration", "2592000")
    assert_bad_input(done, "field --duration:", "calls in durationSeconds")
