"""``kubemoot operator`` — run the Kubernetes operator (kopf) against the current cluster.

Credentials come from the in-cluster service account, else from ``KUBECONFIG``. The
provider-state documents go to NATS JetStream (``--nats`` or ``KUBEMOOT_NATS_URL``, with
credentials and TLS from the ``--nats-*`` flags or ``KUBEMOOT_NATS_*``) or, for a cluster
of one process, to the embedded store (``--embedded``).
"""

from __future__ import annotations

import os

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
    NatsToken,
    NatsUrlOrEnv,
    NatsUser,
    export_nats_env,
    resolve_nats,
)


@app.command("operator")
def operator_command(
    namespaces: list[str] = typer.Option(
        [], "--namespace", "-n", metavar="NAMESPACE",
        help="Watch Agents and policies in this namespace (repeatable).",
    ),
    all_namespaces: bool = typer.Option(
        False, "--all-namespaces", "-A", help="Watch every namespace (the default)."
    ),
    nats: NatsUrlOrEnv = None,
    nats_user: NatsUser = None,
    nats_password: NatsPassword = None,
    nats_token: NatsToken = None,
    nats_creds: NatsCreds = None,
    nats_tls_ca: NatsCA = None,
    nats_tls_cert: NatsCert = None,
    nats_tls_key: NatsKey = None,
    embedded: bool = typer.Option(
        False, "--embedded",
        help="Keep the shared state in this process (agents elsewhere cannot read it).",
    ),
    probe_interval: float = typer.Option(
        30.0, "--probe-interval", min=0.1, metavar="SECONDS",
        help="Seconds between two probes of every ModelProvider.",
    ),
    probe_timeout: float = typer.Option(
        10.0, "--probe-timeout", min=0.1, metavar="SECONDS",
        help="Seconds one provider probe may take.",
    ),
    metrics_port: int = typer.Option(
        0, "--metrics-port", min=0, max=65535, metavar="PORT",
        help="Serve Prometheus metrics on this port at /metrics (0: off).",
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", "--metrics-host", metavar="ADDRESS",
        help="Address for --metrics-port (0.0.0.0 lets an in-cluster Prometheus scrape).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at debug level."),
) -> None:
    """Run the Kubemoot operator: probe providers, bind Agents, patch their Deployments."""
    if namespaces and all_namespaces:
        raise InputError("give --namespace or --all-namespaces, not both", field="--namespace")
    url = nats or os.environ.get("KUBEMOOT_NATS_URL") or None
    if url and embedded:
        raise InputError("give --nats (or KUBEMOOT_NATS_URL) or --embedded, not both",
                         field="--embedded")
    if not url and not embedded:
        raise InputError(
            "no shared store: give --nats nats://HOST:PORT (or set KUBEMOOT_NATS_URL), "
            "or --embedded for a single-process setup",
            field="--nats",
        )
    settings = resolve_nats(
        NatsFlags(url=nats, user=nats_user, password=nats_password, token=nats_token,
                  creds=nats_creds, tls_ca=nats_tls_ca, tls_cert=nats_tls_cert,
                  tls_key=nats_tls_key),
        use_nats=not embedded,
    )
    if settings is not None:
        # The operator opens its store from a URL and KUBEMOOT_NATS_*; handing it the
        # merged settings through this process's environment keeps one source of truth.
        # (No reconnect flags here: those have no variable to travel in.)
        export_nats_env(settings, os.environ)
        url = ",".join(settings.servers)

    import asyncio
    import logging

    from kubemoot.operator.kube import login_from_environment
    from kubemoot.operator.run import OperatorOptions, run_operator

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    options = OperatorOptions(
        namespaces=tuple(dict.fromkeys(namespaces)),
        store_url=None if embedded else url,
        probe_interval=probe_interval,
        probe_timeout=probe_timeout,
    )
    where = ", ".join(options.namespaces) or "all namespaces"
    err_console.print(f"kubemoot operator: watching {where}; shared state in "
                      f"{'this process' if embedded else url}", highlight=False)
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
    asyncio.run(run_operator(options, login=login_from_environment))
