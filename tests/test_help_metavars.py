"""Every option of every command names its value in words in ``--help``.

(An argument's line keeps its type: typer prints ``QUESTION <str>`` there.)

typer's vendored click prints an option that has bounds but no metavar as
``<int range>`` or ``<float range>`` (and a plain one as ``<str>``, ``<int>``,
``<path>``), which tells a reader the type but not what to write.
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from kubemoot.cli import app

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
TYPE_ONLY = re.compile(r"<(int|float)( range)?>|<(str|path|bool)>")


def test_the_commands_are_found() -> None:
    assert {"demo", "emulate-ollama", "simulate", "place", "gateway"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_no_option_shows_only_its_type(command: str) -> None:
    done = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert done.exit_code == 0, done.output
    options = [line for line in done.output.splitlines() if line.lstrip().startswith("-")]
    assert [line for line in options if TYPE_ONLY.search(line)] == [], done.output
