"""The dashboard: a read-only web page over the shared state and per-call attribution.

It mirrors the provider-state, ticket and demand buckets and the call log
(:mod:`kubemoot.dashboard.calllog`) through KV watches, and pushes a fresh picture to
each browser as server-sent events. It also serves ``/metrics``. It is an adapter: it
imports inward (store, clock, metrics) and nothing imports it but the CLI.
"""

from __future__ import annotations

from kubemoot.dashboard.calllog import CALL_LOG_BUCKET, CallEntry, CallLogWriter
from kubemoot.dashboard.fleet import FleetView
from kubemoot.dashboard.server import DEFAULT_HOST, DEFAULT_PORT, DashboardServer

__all__ = [
    "CALL_LOG_BUCKET",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "CallEntry",
    "CallLogWriter",
    "DashboardServer",
    "FleetView",
]
