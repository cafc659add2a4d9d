"""What the people who run the gateway ask it: alive? ready? what does each server hold?

* ``GET /healthz`` — the process answers (always 200 while it serves).
* ``GET /readyz`` — 200 when a call could succeed now, else 503 with the reasons: the
  shared store answers, at least one provider is ready, and the inference path works
  (not every ready provider's circuit is open, and the last calls did not all fail).
  Both call checks end by themselves, as the circuit does: a load balancer that stops
  sending calls to an unready replica would otherwise never send the one call that
  could prove it well again. An open circuit half-opens after its cool-down (then it
  admits a trial call, and the replica is ready); failed calls hold the replica unready
  for one circuit cool-down after the last of them, no longer.
* ``GET /api/kubemoot/providers`` — each server: its probed state, circuit, copies
  with their expiry, tickets, the last probe, and the queue per model (it needs an
  API key when the gateway has keys; the probes never do: load balancers send none).

:class:`GatewayHealth` also watches the store (:class:`~kubemoot.store.health.StoreHealth`)
and says at WARNING, once, when it is lost and when it is back — a lost store turns
every call into a 503 at the guard (:mod:`kubemoot.gateway.guard`), so the log must say
why without ``KUBEMOOT_DEBUG``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kubemoot import metrics
from kubemoot.clock import SystemClock
from kubemoot.gateway.errors import GatewayError, error_response
from kubemoot.gateway.keys import ApiKeys
from kubemoot.runtime.builder import Runtime
from kubemoot.runtime.snapshot import FleetSnapshot, ProviderSnapshot
from kubemoot.store.health import StoreHealth
from kubemoot.store.protocol import Bucket, StoreError

__all__ = ["GatewayHealth"]

log = logging.getLogger(__name__)

# Statuses that mean the engine or the path to it failed, not the request or capacity.
_PATH_FAILURES = frozenset({500, 502, 504})


class GatewayHealth:
    """Readiness of one gateway over its runtime stack; :meth:`routes` serves it."""

    def __init__(self, stack: Runtime, states: Bucket, *, check_seconds: float,
                 unready_after_failures: int, keys: ApiKeys | None = None) -> None:
        self.stack = stack
        self.keys = keys  # the providers page shows the fleet: a key when keys are on
        # Real time, whatever clock the runtime was given: the check watches real I/O,
        # and an injected test clock's sleep would move the runtime's time on.
        self.store = StoreHealth(states, clock=SystemClock(), every=check_seconds)
        self.store.on_change(self._store_changed)
        self.unready_after_failures = max(1, unready_after_failures)
        self.failures_in_a_row = 0
        self.last_status: int | None = None
        self._failed_at = float("-inf")  # the last path failure, on the runtime's clock
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.store.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _store_changed(self, health: StoreHealth) -> None:
        if health.reachable:
            log.warning("gateway: the shared store answers again; calls are placed again")
        else:
            log.warning("gateway: the shared store does not answer (%s); calls are "
                        "answered 503 with Retry-After until it is back", health.reason)

    def store_lost(self) -> str | None:
        """Why the store is away, or ``None`` while it answers (the guard asks)."""
        return None if self.store.reachable else (self.store.reason or "no answer")

    def outcome(self, status: int) -> None:
        """An inference call ended with ``status`` (the access log tells)."""
        self.last_status = status
        if status in _PATH_FAILURES:
            self.failures_in_a_row += 1
            self._failed_at = self.stack.clock.now()
        elif 200 <= status < 300:
            self.failures_in_a_row = 0

    # -- answers ---------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """Its routes; ``/metrics`` refreshes the queue gauge before it renders."""
        return [Route("/healthz", self._healthz, methods=["GET", "HEAD"]),
                Route("/readyz", self._readyz, methods=["GET", "HEAD"]),
                Route("/api/kubemoot/providers", self._providers, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"])]

    async def _metrics(self, request: Request) -> Response:
        try:
            await self._servers()
        except StoreError as error:  # the rest of the metrics still tell something
            metrics.survived("gateway", "queue-gauge", metrics.STORE,
                             "reading the fleet for the queue gauge failed", error, logger=log)
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether a call could succeed now, with one entry per check."""
        checks: dict[str, Any] = {}
        lost = self.store_lost()
        checks["store"] = {"ok": lost is None, **({"reason": lost} if lost else {})}
        fleet: FleetSnapshot | None = None
        if lost is None:
            try:
                fleet = await self.stack.view.snapshot()
            except StoreError as error:
                checks["store"] = {"ok": False, "reason": str(error)}
        ready = [p for p in fleet.providers if p.state.ready] if fleet is not None else []
        checks["providers"] = {"ok": bool(ready), "ready": sorted(p.name for p in ready),
                               "known": len(fleet.providers) if fleet is not None else None}
        open_circuits = sorted(p.name for p in ready if p.circuit_open)
        inference: dict[str, Any] = {
            "ok": True, "openCircuits": open_circuits,
            "failuresInARow": self.failures_in_a_row, "lastStatus": self.last_status}
        if ready and len(open_circuits) == len(ready):
            inference.update(ok=False, reason="every ready provider's circuit is open")
        elif self.failures_in_a_row >= self.unready_after_failures:
            since = self.stack.clock.now() - self._failed_at
            if since < self.stack.settings.circuit_cooldown_seconds:
                inference.update(ok=False, reason=f"the last {self.failures_in_a_row} calls "
                                 "failed on their provider")
            else:  # as a circuit half-opens: let a call find out whether it is well again
                inference["note"] = (f"the last {self.failures_in_a_row} calls failed, the "
                                     f"last {since:.0f} s ago; calls may try again")
        checks["inference"] = inference
        return all(c["ok"] for c in checks.values()), checks

    async def _readyz(self, request: Request) -> Response:
        ok, checks = await self.readiness()
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503,
                            headers={} if ok else {"Retry-After": "1"})

    async def _providers(self, request: Request) -> Response:
        if self.keys is not None:
            try:
                self.keys.caller(request.headers.get("authorization"))
            except GatewayError as error:
                return error_response(error, openai=False)
        return JSONResponse(await self._servers())

    async def _servers(self) -> dict[str, Any]:
        """Each server as ``/api/kubemoot/providers`` shows it; sets the queue gauge."""
        fleet = await self.stack.view.snapshot()
        try:
            demand = await self.stack.board.snapshot()
            waiting = {m: d.waiters for m, d in demand.models.items() if d.waiters}
        except StoreError as error:
            metrics.survived("gateway", "providers-demand", metrics.STORE,
                             "reading the demand board failed", error, logger=log)
            waiting = {}
        circuits = self.stack.view.circuits
        servers = []
        for p in fleet.providers:
            circuit = circuits.state(p.name).value if circuits is not None else "closed"
            servers.append(_server(p, fleet.now, circuit))
        _publish_queue(fleet, waiting)
        return {"now": fleet.now, "providers": servers, "waiting": dict(sorted(waiting.items()))}


def _queue(p: ProviderSnapshot) -> dict[str, dict[str, int]]:
    """Per model: calls in flight on the copy, its slots, and how many wait in line."""
    models = sorted(p.copies | {t.model for t in p.tickets})
    out = {}
    for model in models:
        calls = len(p.in_flight(model))
        out[model] = {"inFlight": calls, "slots": p.slots, "queued": max(0, calls - p.slots)}
    return out


def _server(p: ProviderSnapshot, now: float, circuit: str) -> dict[str, Any]:
    state = p.state
    return {
        "provider": p.name, "endpoint": state.endpoint, "ready": state.ready,
        "reason": state.reason, "circuit": circuit,
        "lastProbedAt": state.last_probed_at,
        "probeAgeSeconds": (None if state.last_probed_at is None
                            else round(now - state.last_probed_at, 3)),
        "totalVramMiB": state.total_vram_mib, "usableMiB": p.usable_mib,
        "freeMiB": p.free_mib, "maxParallel": state.max_parallel,
        "copies": [m.model_dump(mode="json", by_alias=True) for m in state.loaded_models],
        "tickets": [t.model_dump(mode="json", by_alias=True) for t in p.tickets],
        "queue": _queue(p),
    }


def _publish_queue(fleet: FleetSnapshot, waiting: dict[str, int]) -> None:
    """The queue-depth gauge, set from the same snapshot the page shows."""
    metrics.GATEWAY_QUEUE.clear()
    for p in fleet.providers:
        for model, depth in _queue(p).items():
            metrics.GATEWAY_QUEUE.labels(provider=p.name, model=model).set(depth["queued"])
    for model, count in waiting.items():
        metrics.GATEWAY_QUEUE.labels(provider="", model=model).set(count)
