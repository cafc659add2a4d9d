"""The ``kubemoot`` command.

Each sub-command lives in its own module in this package and registers itself on
:data:`app` when imported; this module discovers them, so adding a command never
touches another command's file. Command modules import heavy libraries (kopf,
matplotlib, nats) inside the command function so ``kubemoot --help`` stays quick.

Exit status: 0 success, 2 bad input (the message names file, document and field),
1 anything else, 128 + the signal's number after SIGTERM (143) or Ctrl-C (130), which
every long-running command answers by shutting down cleanly. No traceback reaches
the user unless ``KUBEMOOT_DEBUG=1``.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

from rich.markup import escape

from kubemoot.api.errors import InputError
from kubemoot.cli._common import app, err_console
from kubemoot.cli._shutdown import Stopped
from kubemoot.settings import SettingError

__all__ = ["app", "main"]


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_register_commands()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; exits with the process status.

    Usage errors (unknown options, out-of-range values) are handled by typer's own
    standalone mode, which prints them with the usage line and exits 2. Everything
    else that escapes a command is turned into one line here.
    """
    debug = os.environ.get("KUBEMOOT_DEBUG") == "1"
    try:
        app(args=argv, prog_name="kubemoot", standalone_mode=True)
    except (InputError, SettingError) as error:
        err_console.print(
            f"[bold red]error:[/] {escape(error.describe())}", highlight=False, soft_wrap=True
        )
        if debug:
            raise
        sys.exit(2)
    except Stopped as stopped:  # SIGTERM or Ctrl-C, after a clean shutdown
        err_console.print(stopped.describe(), highlight=False)
        sys.exit(stopped.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted", highlight=False)
        sys.exit(130)
    except Exception as error:  # the last line of defence: a message, not a traceback
        if debug:
            raise
        err_console.print(
            f"[bold red]error:[/] {escape(f'{type(error).__name__}: {error}')}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)
    return 0
