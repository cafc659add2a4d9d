"""``kubemoot dashboard`` — the read-only web page over shared state.

With ``--nats`` it watches a NATS JetStream store that runtimes and probers elsewhere
write to. ``--embedded`` (the default) watches an embedded store of this process, which
starts empty: the embedded store cannot be shared between processes, so to watch the
demo on it run ``kubemoot demo --dashboard``, which serves this same page in-process.
"""

from __future__ import annotations

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import app, err_console


@app.command("dashboard")
def dashboard_command(
    nats: str | None = typer.Option(
        None, "--nats", help="Watch this NATS server (nats://host:4222)."
    ),
    embedded: bool = typer.Option(
        False, "--embedded",
        help="Watch an embedded store of this process (the default; it starts empty).",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind; loopback by default (no login)."
    ),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port (0: any free)."),
    stale_after: float = typer.Option(
        120.0, "--stale-after", min=0.0,
        help="Seconds after its last probe a provider shows as stale.",
    ),
) -> None:
    """Serve the dashboard: providers, tickets, demand and where each call ran."""
    import asyncio

    if nats is not None and embedded:
        raise InputError("--nats and --embedded exclude each other", field="--nats")

    async def run() -> None:
        from kubemoot.clock import SystemClock
        from kubemoot.dashboard.server import DashboardServer
        from kubemoot.store import open_store

        clock = SystemClock()
        try:
            kv = await open_store(nats, clock=clock)
        except ValueError as error:
            raise InputError(str(error), field="--nats") from None
        try:
            server = DashboardServer(kv, host=host, port=port, clock=clock,
                                     freshness_seconds=stale_after)
            try:
                await server.start()
            except OSError as error:
                raise InputError(f"cannot listen on {host}:{port}: {error.strerror or error}",
                                 field="--port") from None
            try:
                source = nats or "the embedded store (empty until this process writes to it)"
                err_console.print(f"dashboard: {server.url} watching {source}; Ctrl-C stops it",
                                  highlight=False, soft_wrap=True)
                await server.wait()
            finally:
                await server.stop()
        finally:
            await kv.close()

    asyncio.run(run())
