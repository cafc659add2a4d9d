"""``kubemoot dashboard`` — the read-only web page over shared state.

With ``--nats`` it watches a NATS JetStream store that runtimes and probers elsewhere
write to. ``--embedded`` (the default) watches an embedded store of this process, which
starts empty: the embedded store cannot be shared between processes, so to watch the
demo on it run ``kubemoot demo --dashboard``, which serves this same page in-process.

SIGTERM and Ctrl-C stop it cleanly (:mod:`kubemoot.cli._shutdown`); its tunables come
from ``KUBEMOOT_*`` (:class:`~kubemoot.settings.Settings`).
"""

from __future__ import annotations

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import app, err_console
from kubemoot.cli._nats import (
    NO_NATS_FLAGS,
    NatsFlags,
    mask_servers,
    nats_options,
    open_shared_store,
    resolve_nats,
)


@app.command("dashboard")
@nats_options()
def dashboard_command(
    nats: NatsFlags = NO_NATS_FLAGS,
    embedded: bool = typer.Option(
        False, "--embedded",
        help="Watch an embedded store of this process (the default; it starts empty).",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", metavar="ADDRESS",
        help="Address to bind; loopback by default (no login)."
    ),
    port: int = typer.Option(8765, "--port", metavar="PORT", min=0, max=65535,
        help="Port (0: any free)."),
    allow_hosts: list[str] = typer.Option(
        [], "--allow-host", metavar="NAME",
        help="A host name the page may be reached by, besides localhost and IP addresses "
        "(repeatable; e.g. the name of a Service or an ingress). Other Host headers get "
        "403, so a foreign web page cannot rebind its DNS name to this dashboard.",
    ),
    stale_after: float = typer.Option(
        120.0, "--stale-after", metavar="SECONDS", min=0.0,
        help="Seconds after its last probe a provider shows as stale.",
    ),
) -> None:
    """Serve the dashboard: providers, tickets, demand and where each call ran."""
    from kubemoot.cli._common import check_host, install_log_lines, listen_error
    from kubemoot.cli._shutdown import run_until_stopped
    from kubemoot.settings import Settings

    if nats.url is not None and embedded:
        raise InputError("--nats and --embedded exclude each other", field="--nats")
    settings = resolve_nats(nats, use_nats=nats.url is not None)
    check_host(host)  # before connecting to NATS: a typo here should not wait on a store
    tunables = Settings.from_env()
    install_log_lines()  # "shared state unreachable", "answers again": one line each
    # The name it was told to listen on is a name it may be reached by.
    page = tunables.dashboard.allowing([*allow_hosts, host])

    async def run() -> None:
        from kubemoot.clock import SystemClock
        from kubemoot.dashboard.server import DashboardServer
        from kubemoot.process import Lifecycle, Stage

        clock = SystemClock()
        process = Lifecycle(straggler_grace=tunables.process.straggler_grace_seconds)
        try:
            kv = await open_shared_store(settings, clock=clock,
                                         connect_wait=tunables.process.connect_wait_seconds)
            process.on_stop(Stage.STORE, kv.close, name="store")
            server = DashboardServer(kv, host=host, port=port, clock=clock,
                                     freshness_seconds=stale_after, settings=page)
            try:
                await server.start()
            except OSError as error:
                raise listen_error(host, port, error) from None
            process.on_stop(Stage.RUNTIME, server.stop, name="dashboard")
            source = (mask_servers(settings.servers) if settings is not None
                      else "the embedded store (empty until this process writes to it)")
            err_console.print(f"dashboard: {server.url} watching {source}; Ctrl-C stops it",
                              highlight=False, soft_wrap=True, markup=False)
            await server.wait()
        finally:
            await process.shutdown()

    run_until_stopped(run(), grace_seconds=tunables.process.shutdown_grace_seconds)
