"""Running the operator: credentials, the shared store, kopf settings and the probe loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import kopf

from kubemoot.api import InputError
from kubemoot.clock import Clock, SystemClock
from kubemoot.operator.handlers import build_registry
from kubemoot.operator.kube import KubeClient
from kubemoot.operator.reconciler import Reconciler
from kubemoot.runtime.builder import build_runtime
from kubemoot.settings import DEFAULTS, ProcessSettings
from kubemoot.store.declared import MODEL_SIZES_BUCKET
from kubemoot.store.documents import (
    MODEL_DEMAND_BUCKET,
    MODEL_DEMAND_MAX_AGE_SECONDS,
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
)
from kubemoot.store.protocol import KV, Bucket

__all__ = [
    "DEFAULT_PROBE_INTERVAL",
    "DEFAULT_PROBE_TIMEOUT",
    "OpenStore",
    "OperatorOptions",
    "cluster_login",
    "kopf_settings",
    "open_shared_buckets",
    "run_operator",
    "serve",
]

log = logging.getLogger(__name__)

# The defaults live in kubemoot.settings (KUBEMOOT_PROBE_INTERVAL_SECONDS, …).
DEFAULT_PROBE_INTERVAL = DEFAULTS.probe_interval_seconds
DEFAULT_PROBE_TIMEOUT = DEFAULTS.probe_timeout_seconds
_PROCESS = ProcessSettings()

Login = Callable[[], Awaitable[kopf.ConnectionInfo]]
#: Opens the shared store (the CLI's says where it connects and masks passwords).
OpenStore = Callable[[Clock], Awaitable[KV]]


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    """What ``kubemoot operator`` was asked to do.

    No ``namespaces`` means every namespace. Model, ModelProvider, MootArchetype and
    KubemootConfig are cluster-scoped and always watched cluster-wide.
    """

    namespaces: tuple[str, ...] = ()
    probe_interval: float = DEFAULT_PROBE_INTERVAL
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    # After SIGTERM or Ctrl-C, kopf's stop may take this long before the process is killed.
    shutdown_grace_seconds: float = _PROCESS.shutdown_grace_seconds
    #: Of that, what the operator's own leftover tasks get before they are cancelled.
    straggler_grace_seconds: float = _PROCESS.straggler_grace_seconds
    #: kopf's liveness endpoint ``http://HOST:PORT/healthz`` for the Pod's probes (0: off).
    health_port: int = 0
    health_host: str = "127.0.0.1"

    @property
    def liveness_endpoint(self) -> str | None:
        if not self.health_port:
            return None
        return f"http://{self.health_host}:{self.health_port}/healthz"


def kopf_settings(*, shutdown_grace_seconds: float | None = None) -> kopf.OperatorSettings:
    """kopf settings of the Kubemoot operator."""
    settings = kopf.OperatorSettings()
    # kopf answers SIGTERM and SIGINT itself while it serves; its last-resort exit
    # (10 minutes by default) gets the same bound as every other command's shutdown.
    settings.process.ultimate_exiting_timeout = (
        _PROCESS.shutdown_grace_seconds if shutdown_grace_seconds is None
        else shutdown_grace_seconds)
    # The CRDs ship with the operator (deploy/base); rescanning the API for new
    # resources and namespaces is not needed and would need cluster-wide list rights.
    settings.scanning.disabled = True
    # One replica (the Deployment uses Recreate): no KopfPeering CRD to install.
    settings.peering.standalone = True
    # kopf turns its own log lines into Events; keep only warnings and errors.
    settings.posting.level = logging.WARNING
    return settings


async def cluster_login() -> kopf.ConnectionInfo:
    """In-cluster service account, else ``$KUBECONFIG`` / ``~/.kube/config``.

    Kept as the default ``login`` of :func:`run_operator`; the checks (and their one-line
    messages naming the kubeconfig file) live in :func:`kube.login_from_environment`.
    """
    from kubemoot.operator.kube import login_from_environment

    return await login_from_environment()


async def serve(
    reconciler: Reconciler,
    *,
    login: Login,
    namespaces: Sequence[str] = (),
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    settings: kopf.OperatorSettings | None = None,
    liveness_endpoint: str | None = None,
) -> None:
    """Run kopf with our handlers and the probe loop until ``stop`` is set.

    ``liveness_endpoint`` (``http://HOST:PORT/healthz``) is kopf's own: it answers only
    while kopf's loop runs, which is what a Pod's liveness and readiness probes ask.
    """
    registry = build_registry(reconciler, login=login)
    probes = asyncio.create_task(reconciler.run_probes(), name="kubemoot-probes")
    try:
        await kopf.operator(
            registry=registry,
            settings=settings or kopf_settings(),
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            standalone=True,
            stop_flag=stop,
            ready_flag=ready,
            liveness_endpoint=liveness_endpoint,
        )
    finally:
        reconciler.stop_probes()
        # kopf cancels the tasks of its loop when it stops, the probe loop among them;
        # wait() neither raises that cancellation nor an error, which is logged instead.
        await asyncio.wait([probes])
        if not probes.cancelled() and probes.exception() is not None:
            log.error("the probe loop failed", exc_info=probes.exception())
        await reconciler.close()


async def open_shared_buckets(store: KV) -> Bucket:
    """Open every bucket the runtime shares; the provider-state bucket is returned.

    The operator writes only provider state and declared model sizes, but it opens the
    ticket and demand buckets too: it is the one component a cluster configures with
    ``KUBEMOOT_NATS_REPLICAS``, and opening a bucket creates it with (or raises it to)
    that many copies. Left to the agents, the first to start would create the ticket
    bucket with one copy.
    """
    states = await store.bucket(PROVIDER_STATE_BUCKET)
    await store.bucket(PROVIDER_TICKETS_BUCKET)
    await store.bucket(MODEL_DEMAND_BUCKET, max_age=MODEL_DEMAND_MAX_AGE_SECONDS)
    await store.bucket(MODEL_SIZES_BUCKET)
    return states


async def run_operator(
    options: OperatorOptions, *, clock: Clock | None = None, login: Login = cluster_login,
    open_kv: OpenStore | None = None,
) -> None:
    """Check the credentials, open the shared store, then serve until interrupted.

    The store comes from ``open_kv`` (the CLI's connects to NATS with the user's
    credentials and TLS); without it, the embedded store serves one process only.
    SIGTERM and SIGINT stop kopf gracefully (kopf handles both); then the process's
    lifecycle stops what is left in its order, the store last.
    """
    from kubemoot.process import Lifecycle, Stage
    from kubemoot.store import open_store

    try:
        await login()  # fail now with a message, not later inside kopf's retry loop
    except (OSError, ValueError, KeyError, TypeError, kopf.LoginError) as error:
        raise InputError(f"cannot read Kubernetes credentials: {error}") from None
    clock = clock or SystemClock()
    process = Lifecycle(straggler_grace=options.straggler_grace_seconds)
    try:
        store: KV = (await open_kv(clock) if open_kv is not None
                     else await open_store(clock=clock))
        process.on_stop(Stage.STORE, store.close, name="store")
        bucket = await open_shared_buckets(store)
        kube = KubeClient(login)
        reconciler = Reconciler(
            kube,
            clock=clock,
            bucket=bucket,
            sizes=await store.bucket(MODEL_SIZES_BUCKET),
            probe_interval=options.probe_interval,
            probe_timeout=options.probe_timeout,
        )
        # pinned models are loaded back as calls of the runtime, over the operator's clients
        reconciler.runtime = await build_runtime(store, clock=clock, clients=reconciler.clients)
        await serve(reconciler, login=login, namespaces=options.namespaces,
                    liveness_endpoint=options.liveness_endpoint,
                    settings=kopf_settings(
                        shutdown_grace_seconds=options.shutdown_grace_seconds))
    finally:
        await process.shutdown()
