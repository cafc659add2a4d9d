"""``kubemoot operator`` — run the Kubernetes operator (kopf) against the current cluster.

Credentials come from the in-cluster service account, else from ``KUBECONFIG``. The
provider-state documents go to NATS JetStream (``--nats`` or ``KUBEMOOT_NATS_URL``, with
credentials and TLS from the ``--nats-*`` flags or ``KUBEMOOT_NATS_*``) or, for a cluster
of one process, to the embedded store (``--embedded``).
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
from kubemoot.settings import DEFAULTS, ENV_VARIABLES, Settings

_DEFAULTS = DEFAULTS


@app.command("operator")
@nats_options(url_from_env=True, reconnect=False)
def operator_command(
    namespaces: list[str] = typer.Option(
        [], "--namespace", "-n", metavar="NAMESPACE",
        help="Watch Agents and policies in this namespace (repeatable).",
    ),
    all_namespaces: bool = typer.Option(
        False, "--all-namespaces", "-A", help="Watch every namespace (the default)."
    ),
    nats: NatsFlags = NO_NATS_FLAGS,
    embedded: bool = typer.Option(
        False, "--embedded",
        help="Keep the shared state in this process (agents elsewhere cannot read it).",
    ),
    probe_interval: float | None = typer.Option(
        None, "--probe-interval", min=0.1, metavar="SECONDS",
        help=f"Seconds between two probes of every ModelProvider (default "
        f"{_DEFAULTS.probe_interval_seconds:g}, "
        f"{ENV_VARIABLES['runtime.probe_interval_seconds']}).",
    ),
    probe_timeout: float | None = typer.Option(
        None, "--probe-timeout", min=0.1, metavar="SECONDS",
        help=f"Seconds one provider probe may take (default "
        f"{_DEFAULTS.probe_timeout_seconds:g}, "
        f"{ENV_VARIABLES['runtime.probe_timeout_seconds']}).",
    ),
    metrics_port: int = typer.Option(
        0, "--metrics-port", min=0, max=65535, metavar="PORT",
        help="Serve Prometheus metrics on this port at /metrics (0: off).",
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", "--metrics-host", metavar="ADDRESS",
        help="Address for --metrics-port (0.0.0.0 lets an in-cluster Prometheus scrape).",
    ),
    health_port: int = typer.Option(
        0, "--health-port", min=0, max=65535, metavar="PORT",
        help="Answer liveness and readiness probes at /healthz on this port (0: off); "
        "it listens on --metrics-host.",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at debug level."),
) -> None:
    """Run the Kubemoot operator: probe providers, bind Agents, patch their Deployments."""
    if namespaces and all_namespaces:
        raise InputError("give --namespace or --all-namespaces, not both", field="--namespace")
    named = nats.names_servers()
    if named and embedded:
        raise InputError("give --nats (or KUBEMOOT_NATS_URL) or --embedded, not both",
                         field="--embedded")
    if not named and not embedded:
        raise InputError(
            "no shared store: give --nats nats://HOST:PORT (or set KUBEMOOT_NATS_URL), "
            "or --embedded for a single-process setup",
            field="--nats",
        )
    settings = resolve_nats(nats, use_nats=not embedded)
    tunables = Settings.from_env()

    import logging

    from kubemoot.cli._shutdown import run_until_stopped
    from kubemoot.clock import Clock
    from kubemoot.operator.kube import login_from_environment
    from kubemoot.operator.run import OperatorOptions, run_operator
    from kubemoot.store.protocol import KV

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options = OperatorOptions(
        namespaces=tuple(dict.fromkeys(namespaces)),
        probe_interval=probe_interval or tunables.runtime.probe_interval_seconds,
        probe_timeout=probe_timeout or tunables.runtime.probe_timeout_seconds,
        shutdown_grace_seconds=tunables.process.shutdown_grace_seconds,
        straggler_grace_seconds=tunables.process.straggler_grace_seconds,
        health_port=health_port,
        health_host=metrics_host,
    )

    async def open_kv(clock: Clock) -> KV:
        return await open_shared_store(settings, clock=clock,
                                       connect_wait=tunables.process.connect_wait_seconds)

    where = ", ".join(options.namespaces) or "all namespaces"
    shown = "this process" if settings is None else mask_servers(settings.servers)
    err_console.print(f"kubemoot operator: watching {where}; shared state in {shown}",
                      highlight=False, markup=False, soft_wrap=True)
    if metrics_port:
        from kubemoot.metrics import serve_metrics

        try:
            serve_metrics(metrics_port, host=metrics_host)
        except OSError as error:
            raise InputError(f"cannot serve metrics on {metrics_host}:{metrics_port}: "
                             f"{error.strerror or error}", field="--metrics-port") from None
        err_console.print(f"metrics: http://{metrics_host}:{metrics_port}/metrics",
                          highlight=False)
    # The credential check names a broken kubeconfig file in one line (exit 2).
    run_until_stopped(run_operator(options, login=login_from_environment, open_kv=open_kv),
                      grace_seconds=tunables.process.shutdown_grace_seconds)
