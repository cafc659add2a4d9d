"""``kubemoot version``."""

from __future__ import annotations

from kubemoot import __version__
from kubemoot.cli._common import app, console


@app.command()
def version() -> None:
    """Print the Kubemoot version."""
    console.print(__version__)
