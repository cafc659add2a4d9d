"""Prometheus metrics shared by every kubemoot process.

The metric objects live here, in one registry, so the runtime, the prober, the operator
and the dashboard count into the same names whichever process they run in. Any process
exposes them with :func:`serve_metrics` (its own small HTTP listener) or by returning
:func:`render` from a web route, as the dashboard's ``/metrics`` does.

This module imports nothing else of ours, so every layer may import it. Incrementing a
counter is process-local and never does I/O; under the simulator the counts simply
describe the simulated run.
"""

from __future__ import annotations

import logging

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

__all__ = [
    "BUG",
    "CAS_CONFLICTS",
    "CLAIMS",
    "CLEANUP",
    "CONTENT_TYPE",
    "DECISIONS",
    "ERRORS_SURVIVED",
    "EVICTIONS",
    "GATEWAY_CALLS",
    "GATEWAY_CALL_SECONDS",
    "GATEWAY_FIRST_BYTE_SECONDS",
    "GATEWAY_QUEUE",
    "GATEWAY_REQUESTS",
    "GATEWAY_SHED",
    "GATEWAY_TOKENS",
    "LEASE_RENEWALS",
    "PLACEMENT_SECONDS",
    "PROBE_ERRORS",
    "PROVIDER",
    "RECONCILES",
    "REFUSALS",
    "REGISTRY",
    "STORE",
    "UNREADABLE",
    "WAITS",
    "WAIT_SECONDS",
    "render",
    "serve_metrics",
    "survived",
]

REGISTRY = CollectorRegistry(auto_describe=True)
"""Our own registry (not the library's global one), so tests and embedding programs
see exactly kubemoot's series plus the usual process, platform and GC collectors."""

ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

CONTENT_TYPE = CONTENT_TYPE_LATEST

# A placement reads shared state and may claim by compare-and-set: milliseconds when the
# cache is warm, up to seconds when an eviction unloads models on the way.
_PLACEMENT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                      10.0, 30.0)
# Waiting for a GPU lasts as long as other calls run: seconds to minutes.
_WAIT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

PLACEMENT_SECONDS = Histogram(
    "kubemoot_placement_seconds",
    "Time CallPlanner.place took to decide one call (one attempt, not the wait).",
    buckets=_PLACEMENT_BUCKETS,
    registry=REGISTRY,
)
DECISIONS = Counter(
    "kubemoot_placement_decisions",
    "Per-call placement decisions by action (warm, loading, cold-load, unload, queue, "
    "wait, refuse, static).",
    ["action"],
    registry=REGISTRY,
)
CLAIMS = Counter(
    "kubemoot_ticket_claims",
    "VRAM ticket claims by result: granted, rejected (the budget said no) or conflict "
    "(every compare-and-set attempt lost a race).",
    ["result"],
    registry=REGISTRY,
)
CAS_CONFLICTS = Counter(
    "kubemoot_ticket_cas_conflicts",
    "Compare-and-set writes of a provider's ticket document that lost to a concurrent "
    "writer and were decided again.",
    registry=REGISTRY,
)
EVICTIONS = Counter(
    "kubemoot_evictions",
    "Idle models unloaded to make room for a call, by provider.",
    ["provider"],
    registry=REGISTRY,
)
WAITS = Counter(
    "kubemoot_capacity_waits",
    "Calls that had to wait for GPU capacity.",
    registry=REGISTRY,
)
WAIT_SECONDS = Histogram(
    "kubemoot_capacity_wait_seconds",
    "How long a waiting call waited, until it was placed or gave up.",
    ["outcome"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
REFUSALS = Counter(
    "kubemoot_refusals",
    "Calls that could not be placed, by reason (gpu-busy, model-too-large, "
    "prompt-too-large).",
    ["reason"],
    registry=REGISTRY,
)
PROBE_ERRORS = Counter(
    "kubemoot_probe_errors",
    "Provider probes that found the provider not ready, by provider.",
    ["provider"],
    registry=REGISTRY,
)
ERRORS_SURVIVED = Counter(
    "kubemoot_errors_survived",
    "Errors that were logged and worked around instead of raised, by component (runtime, "
    "agent, prober, provider, store), operation (release, publish, tickets, demand, ...) "
    "and kind (store, unreadable, provider, cleanup, bug). Count them with survived().",
    ["component", "operation", "kind"],
    registry=REGISTRY,
)
LEASE_RENEWALS = Counter(
    "kubemoot_lease_renewals",
    "Renewals of tickets whose call or held plan is still alive, by result: renewed, "
    "failed (the store did not answer; tried again at the next turn) or lost (the "
    "ticket was gone).",
    ["result"],
    registry=REGISTRY,
)
RECONCILES = Counter(
    "kubemoot_reconciles",
    "Operator reconciles by resource kind and result (ok, error).",
    ["kind", "result"],
    registry=REGISTRY,
)
GATEWAY_REQUESTS = Counter(
    "kubemoot_gateway_requests",
    "Requests the gateway answered, by route template (a closed set: never the path "
    "a client sent) and HTTP status.",
    ["route", "status"],
    registry=REGISTRY,
)
GATEWAY_SHED = Counter(
    "kubemoot_gateway_refused_at_the_door",
    "Requests the gateway's guard refused before any handler ran, by reason (host, "
    "origin, concurrency, buffered-bodies).",
    ["reason"],
    registry=REGISTRY,
)
# Labels of the per-server series: the provider a call was placed on (the fleet's own
# names) and the route template, never anything a client chooses freely.
GATEWAY_CALLS = Counter(
    "kubemoot_gateway_calls",
    "Inference calls the gateway answered, by provider, route template and status.",
    ["provider", "route", "status"],
    registry=REGISTRY,
)
GATEWAY_CALL_SECONDS = Histogram(
    "kubemoot_gateway_call_seconds",
    "Seconds from a call's arrival to the last byte of its reply, by provider.",
    ["provider"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
GATEWAY_FIRST_BYTE_SECONDS = Histogram(
    "kubemoot_gateway_first_token_seconds",
    "Seconds from a call's arrival to the first byte of its reply body (the first "
    "token of a stream), by provider.",
    ["provider"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
GATEWAY_TOKENS = Counter(
    "kubemoot_gateway_tokens",
    "Tokens the engines reported for the gateway's calls, by provider and kind "
    "(prompt, completion).",
    ["provider", "kind"],
    registry=REGISTRY,
)
GATEWAY_QUEUE = Gauge(
    "kubemoot_gateway_queue_depth",
    "Calls in line at scrape time, by provider and model: calls placed on a copy beyond "
    "its parallel slots (they wait in the engine); provider \"\" counts the calls of "
    "this gateway still waiting for a placement.",
    ["provider", "model"],
    registry=REGISTRY,
)


def render() -> bytes:
    """The registry in Prometheus text format (serve it with :data:`CONTENT_TYPE`)."""
    return bytes(generate_latest(REGISTRY))


def serve_metrics(port: int, *, host: str = "127.0.0.1") -> None:
    """Expose :data:`REGISTRY` on ``http://host:port/metrics`` from a background thread.

    For processes without a web server of their own (the operator, a runtime sidecar).
    Binds to loopback unless told otherwise, like the dashboard.
    """
    from prometheus_client import start_http_server

    start_http_server(port, addr=host, registry=REGISTRY)


# What an error that was worked around was: the ``kind`` label of ERRORS_SURVIVED.
STORE = "store"  # the store did not do what was asked
UNREADABLE = "unreadable"  # a document that does not parse
PROVIDER = "provider"  # a provider (or its exporter) did not answer as it should
CLEANUP = "cleanup"  # closing a watch, a connection or a task failed
BUG = "bug"  # our own code failed; the process went on without that step


def survived(
    component: str,
    operation: str,
    kind: str,
    what: str,
    error: BaseException | None = None,
    *,
    logger: logging.Logger | None = None,
    exc_info: bool = False,
) -> None:
    """The one way to go on past an error: one warning line and one count.

    Nothing is swallowed in silence (DESIGN §5): the line says ``what`` failed and why,
    and the count (``kubemoot_errors_survived{component,operation,kind}``) lets an
    operator see a store or provider that keeps failing. ``logger`` defaults to
    ``kubemoot.<component>``; ``exc_info`` adds the traceback (for ``BUG``).
    """
    ERRORS_SURVIVED.labels(component=component, operation=operation, kind=kind).inc()
    logger = logger or logging.getLogger(f"kubemoot.{component}")
    if error is None:
        logger.warning("%s", what, exc_info=exc_info)
    else:
        # The error itself is an argument of the record, not only text in it: a filter
        # of the CLI's (StoreLossFilter) drops lines caused by an unreachable store,
        # which a store check reports once instead (a demo's line after NATS came back).
        logger.warning("%s: %s (%s)", what, error, type(error).__name__,
                       exc_info=exc_info)
