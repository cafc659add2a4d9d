"""Shared pieces of the CLI: the typer app, consoles and output formats."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer
import yaml
from rich.console import Console

from kubemoot.api.errors import InputError

if TYPE_CHECKING:
    from rich.console import JustifyMethod
    from rich.table import Table

app = typer.Typer(
    name="kubemoot",
    help="Kubemoot schedules LLM work onto GPUs the way kube-scheduler schedules Pods.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    """``kubemoot --version`` prints what ``kubemoot version`` prints, then stops."""
    if value:
        from kubemoot import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version,
        help="Print the version and exit.",
    ),
) -> None:
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


def add_name_column(table: Table, header: str, cells: Iterable[str], *,
                    justify: JustifyMethod = "left") -> None:
    """Add a column of names (models, providers, agents) that is never cut or folded.

    Rich shares a narrow terminal out by folding every column, which splits a name like
    ``qwen3-14b-rtx4090`` over two lines; a name column instead takes the width of its
    widest line, so only the prose columns (``overflow="fold"``) give way.
    """
    widest = max((len(line) for cell in cells for line in cell.splitlines()), default=0)
    table.add_column(header, no_wrap=True, min_width=max(widest, len(header)),
                     justify=justify)


def emit_data(data: Any, fmt: OutputFormat) -> None:
    """Print machine-readable output (json or yaml) on stdout."""
    if fmt is OutputFormat.yaml:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    else:
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def check_host(host: str, *, flag: str = "--host") -> None:
    """Refuse a listen address that does not resolve, naming ``flag`` (exit 2).

    Resolving before binding tells "no such address" (the host's fault) apart from
    "port taken" (the port's), which a bind error alone mixes up.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.getaddrinfo(host, None, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except (OSError, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise InputError(f"{host!r} is not an address to listen on: {reason}",
                         field=flag) from None


# Bind errors that are the address's fault, not the port's.
_HOST_ERRNOS = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EINVAL})


def listen_error(host: str, port: int, error: OSError, *,
                 flag: str | None = None) -> InputError:
    """A failed bind as bad input, naming ``--host`` or ``--port`` by its cause, or
    ``flag`` for a command that takes both in one (``--listen HOST:PORT``)."""
    if flag is None:
        flag = "--host" if error.errno in _HOST_ERRNOS or isinstance(error, socket.gaierror) \
            else "--port"
    return InputError(f"cannot listen on {host}:{port}: {error.strerror or error}", field=flag)


# -- log lines -------------------------------------------------------------------------


class OneLineFormatter(logging.Formatter):
    """``warning: message (Error: why)``: one line per record, a traceback only on demand.

    Library code logs failures with their traceback (``log.exception``) so a developer
    can find them; a user of the command gets the line and, with ``KUBEMOOT_DEBUG=1``,
    the traceback too.
    """

    def __init__(self, *, debug: bool) -> None:
        super().__init__()
        self._debug = debug

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            if self._debug:
                return f"{line}\n{self.formatException(record.exc_info)}"
            error = record.exc_info[1]
            line = f"{line} ({type(error).__name__}: {error})"
        return line


class StoreLossFilter(logging.Filter):
    """Drops records about an unreachable store: a store check says it once instead.

    Without it, every operation that fails while NATS is away (each probe, each ticket,
    each agent's call) prints its own line or traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from kubemoot.store.protocol import StoreUnavailable

        causes: list[object] = list(record.args) if isinstance(record.args, tuple) else []
        if record.exc_info and record.exc_info[1] is not None:
            error: BaseException | None = record.exc_info[1]
            while error is not None:
                causes.append(error)
                error = error.__cause__ or error.__context__
        return not any(isinstance(cause, StoreUnavailable) for cause in causes)


def install_log_lines(*, level: int = logging.WARNING) -> None:
    """Send log records to stderr as single lines (tracebacks with ``KUBEMOOT_DEBUG=1``)."""
    root = logging.getLogger()
    if any(isinstance(h.formatter, OneLineFormatter) for h in root.handlers):
        return  # a second command in the same process (tests) must not double each line
    debug = os.environ.get("KUBEMOOT_DEBUG") == "1"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(debug=debug))
    if not debug:
        handler.addFilter(StoreLossFilter())
    root.addHandler(handler)
    root.setLevel(level)
    if level > logging.DEBUG:
        # httpx writes a line at INFO for every request it sends: with --log-level info
        # each probe of every provider, and every forwarded call beside its own access
        # line. Those belong to a debugging session, not to the access log.
        for chatty in ("httpx", "httpcore"):
            logging.getLogger(chatty).setLevel(max(level, logging.WARNING))
