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
from kubemoot.cli._nats import (
    NatsCA,
    NatsCert,
    NatsCreds,
    NatsFlags,
    NatsKey,
    NatsPassword,
    NatsReconnectAttempts,
    NatsReconnectWait,
    NatsToken,
    NatsUrl,
    NatsUser,
    open_shared_store,
    resolve_nats,
)


@app.command("dashboard")
def dashboard_command(
    nats: NatsUrl = None,
    nats_user: NatsUser = None,
    nats_password: NatsPassword = None,
    nats_token: NatsToken = None,
    nats_creds: NatsCreds = None,
    nats_tls_ca: NatsCA = None,
    nats_tls_cert: NatsCert = None,
    nats_tls_key: NatsKey = None,
    nats_reconnect_attempts: NatsReconnectAttempts = None,
    nats_reconnect_wait: NatsReconnectWait = None,
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

    from kubemoot.cli._common import check_host, listen_error

    if nats is not None and embedded:
        raise InputError("--nats and --embedded exclude each other", field="--nats")
    settings = resolve_nats(
        NatsFlags(url=nats, user=nats_user, password=nats_password, token=nats_token,
                  creds=nats_creds, tls_ca=nats_tls_ca, tls_cert=nats_tls_cert,
                  tls_key=nats_tls_key, reconnect_attempts=nats_reconnect_attempts,
                  reconnect_wait=nats_reconnect_wait),
        use_nats=nats is not None,
    )
    check_host(host)  # before connecting to NATS: a typo here should not wait on a store

    async def run() -> None:
        from kubemoot.clock import SystemClock
        from kubemoot.dashboard.server import DashboardServer

        clock = SystemClock()
        kv = await open_shared_store(settings, clock=clock)
        try:
            server = DashboardServer(kv, host=host, port=port, clock=clock,
                                     freshness_seconds=stale_after)
            try:
                await server.start()
            except OSError as error:
                raise listen_error(host, port, error) from None
            try:
                source = (", ".join(settings.servers) if settings is not None
                          else "the embedded store (empty until this process writes to it)")
                err_console.print(f"dashboard: {server.url} watching {source}; Ctrl-C stops it",
                                  highlight=False, soft_wrap=True)
                await server.wait()
            finally:
                await server.stop()
        finally:
            await kv.close()

    asyncio.run(run())
