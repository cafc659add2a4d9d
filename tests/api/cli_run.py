"""Run the ``kubemoot`` command in this process, for tables of bad-input cases.

A subprocess per case costs a second of start-up; the bound tables have a hundred cases.
:func:`kubemoot.cli.main` is the very entry point the console script calls, so the exit
status and the one-line message are the ones a user sees.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kubemoot.cli import main


@dataclass(frozen=True)
class Outcome:
    """Exit status and the two streams of one command."""

    code: int
    stdout: str
    stderr: str


def run_cli(args: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """``kubemoot ARGS…`` in-process; the status is what ``sys.exit`` was given."""
    capsys.readouterr()  # drop what earlier cases printed
    try:
        main(list(args))
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    out, err = capsys.readouterr()
    return Outcome(code, out, " ".join(err.split()))  # rich wraps long lines


def with_value(document: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``document`` with the dotted ``path`` set (``a.b[0].c``); missing
    mappings on the way are created."""
    out = copy.deepcopy(document)
    node: Any = out
    parts = _split(path)
    for part in parts[:-1]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[parts[-1]] = value
    return out


def _split(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in path.split("."):
        name, _, rest = piece.partition("[")
        if name:
            parts.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            parts.append(int(index))
            rest = rest.removeprefix("[")
    return parts


def assert_refused(outcome: Outcome, *needles: str) -> None:
    """Exit 2, no traceback, nothing on stdout, and every needle in the message."""
    assert outcome.code == 2, (outcome.code, outcome.stdout, outcome.stderr)
    assert "Traceback" not in outcome.stderr
    assert outcome.stdout == ""
    for needle in needles:
        assert needle in outcome.stderr, outcome.stderr
