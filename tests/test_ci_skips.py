"""Under ``CI=true`` a test whose tool is missing fails; elsewhere it skips (tests/ci.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.ci import cannot_run
from tests.operator.test_operator_deploy import render


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception),
                                             ("", pytest.skip.Exception)])
def test_a_missing_tool_fails_only_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="kubectl is not installed"):
        cannot_run("kubectl is not installed")


def test_the_deploy_tests_fail_under_ci_without_kubectl(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no kubectl
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # nor beside Python
    with pytest.raises(pytest.fail.Exception, match="kubectl is not installed"):
        render("dev")
