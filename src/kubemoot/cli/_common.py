"""Shared pieces of the CLI: the typer app, consoles and output formats."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Any

import typer
import yaml
from rich.console import Console

app = typer.Typer(
    name="kubemoot",
    help="Kubemoot schedules LLM work onto GPUs the way kube-scheduler schedules Pods.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """Kubemoot schedules LLM work onto GPUs the way kube-scheduler schedules Pods."""


console = Console()
err_console = Console(stderr=True)


class OutputFormat(StrEnum):
    """``-o``: table for people (the default on a terminal), json or yaml for scripts."""

    table = "table"
    json = "json"
    yaml = "yaml"


OUTPUT_OPTION_HELP = "Output format: table, json or yaml."


def resolve_format(value: OutputFormat | None) -> OutputFormat:
    """No ``-o`` means a table: output for people unless a script asks otherwise."""
    return OutputFormat.table if value is None else value


def emit_data(data: Any, fmt: OutputFormat) -> None:
    """Print machine-readable output (json or yaml) on stdout."""
    if fmt is OutputFormat.yaml:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    else:
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()
