"""The dashboard's web application: one page, its data, live updates and metrics.

Routes (all ``GET``; the dashboard never writes to shared state):

* ``/`` — the page (plain HTML, CSS and JavaScript shipped in this package);
* ``/static/{file}`` — the page's script and style sheet;
* ``/api/state`` — the current :meth:`FleetView.snapshot` as JSON;
* ``/events`` — server-sent events: a ``state`` event with a fresh snapshot whenever a
  watched bucket changes (coalesced), and at least every ``refresh_seconds`` so expiry
  and staleness show without a change;
* ``/metrics`` — Prometheus text: :mod:`kubemoot.metrics` plus gauges of the fleet;
* ``/healthz`` — ``ok``, or 503 while the shared store does not answer.

Every response carries a content security policy and refuses framing and MIME
sniffing. A request whose ``Host`` header is neither loopback, an IP address nor a name
the operator allowed is refused (403): a web page on another site could otherwise
rebind its own DNS name to this address and read the dashboard through the user's
browser. Event streams are capped (503 beyond ``DashboardSettings.max_clients``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubemoot import metrics
from kubemoot.clock import Clock
from kubemoot.dashboard.fleet import FleetView
from kubemoot.serving import StreamWithCleanup
from kubemoot.settings import DashboardSettings
from kubemoot.webguard import host_allowed

__all__ = ["CONTENT_SECURITY_POLICY", "GuardMiddleware", "create_app"]

_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}



# The page loads only its own script and style sheet and talks only to its own origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class GuardMiddleware:
    """Refuses foreign ``Host`` headers and adds the security headers to every reply."""

    def __init__(self, app: ASGIApp, settings: DashboardSettings) -> None:
        self._app = app
        self._settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        host = next((value.decode("latin-1") for key, value in scope["headers"]
                     if key == b"host"), "")

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        if not host_allowed(host, allowed=self._settings.allowed_hosts):
            refused = PlainTextResponse(
                "this dashboard answers only to loopback, IP addresses and the host names "
                "given with --allow-host", status_code=403)
            await refused(scope, receive, send_guarded)
            return
        await self._app(scope, receive, send_guarded)


class FleetCollector(Collector):
    """Gauges of what the dashboard sees, computed at scrape time."""

    def __init__(self, view: FleetView, clients: list[int]) -> None:
        self._view = view
        self._clients = clients

    def collect(self) -> Iterable[Metric]:
        snap = self._view.snapshot()
        ready = GaugeMetricFamily(
            "kubemoot_provider_ready", "1 when the provider's last probe found it ready.",
            labels=["provider"],
        )
        vram = GaugeMetricFamily(
            "kubemoot_provider_vram_mib", "A provider's VRAM by use, in MiB.",
            labels=["provider", "use"],
        )
        age = GaugeMetricFamily(
            "kubemoot_provider_probe_age_seconds", "Seconds since the provider's last probe.",
            labels=["provider"],
        )
        for p in snap["providers"]:
            name = p["provider"]
            ready.add_metric([name], 1.0 if p["ready"] else 0.0)
            for use, key in (("total", "totalVramMiB"), ("resident", "residentMiB"),
                             ("loading", "loadingMiB"), ("reserve", "reserveMiB"),
                             ("free", "freeMiB")):
                if p[key] is not None:
                    vram.add_metric([name, use], float(p[key]))
            if p["ageSeconds"] is not None:
                age.add_metric([name], float(p["ageSeconds"]))
        tickets = GaugeMetricFamily(
            "kubemoot_active_tickets", "Live VRAM tickets by provider and state.",
            labels=["provider", "state"],
        )
        counts: dict[tuple[str, str], int] = {}
        for t in snap["tickets"]:
            counts[(t["provider"], t["state"])] = counts.get((t["provider"], t["state"]), 0) + 1
        for (provider, state), n in sorted(counts.items()):
            tickets.add_metric([provider, state], float(n))
        clients = GaugeMetricFamily(
            "kubemoot_dashboard_clients", "Browsers connected to the live stream.",
            value=float(self._clients[0]),
        )
        store_up = GaugeMetricFamily(
            "kubemoot_dashboard_store_up", "1 while the shared store answers the dashboard.",
            value=1.0 if snap["store"]["reachable"] else 0.0,
        )
        return [ready, vram, age, tickets, clients, store_up]


FIRST_STATE_MARK = "<!--first-state-->"


def first_state(snapshot: dict[str, Any]) -> str:
    """``snapshot`` as a JSON data block for the page (read, never run, by the script).

    Names in it come from other processes: ``<`` is written as ``\\u003c`` so that no
    value can close the element (``</script>``) or open a comment, and ``&`` as
    ``\\u0026``; JSON reads both back unchanged.
    """
    text = json.dumps(snapshot, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script id="first-state" type="application/json">{text}</script>'


def _asset(name: str) -> str:
    return resources.files("kubemoot.dashboard").joinpath("assets", name).read_text("utf-8")


def create_app(
    view: FleetView, *, clock: Clock, settings: DashboardSettings | None = None,
    stopping: asyncio.Event | None = None,
) -> ASGIApp:
    """The app over a started :class:`FleetView`, behind :class:`GuardMiddleware`.

    ``stopping`` ends every live stream when set, so a server can shut down promptly.
    """
    tune = settings or DashboardSettings()
    clients = [0]
    fleet_registry = CollectorRegistry(auto_describe=False)
    fleet_registry.register(FleetCollector(view, clients))
    done = stopping or asyncio.Event()

    async def page(request: Request) -> Response:
        # The page carries the snapshot of this moment, so its first paint shows the
        # fleet instead of empty tables until the event stream's first update.
        return HTMLResponse(_asset("index.html").replace(
            FIRST_STATE_MARK, first_state(view.snapshot())))

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return PlainTextResponse("not found", status_code=404)
        return Response(_asset(name), media_type=_STATIC[name],
                        headers={"Cache-Control": "no-cache"})

    async def state(request: Request) -> Response:
        return JSONResponse(view.snapshot())

    async def events(request: Request) -> Response:
        if clients[0] >= tune.max_clients:
            return PlainTextResponse(
                f"too many live pages ({tune.max_clients}); close one or raise "
                "KUBEMOOT_DASHBOARD_MAX_CLIENTS", status_code=503,
                headers={"Retry-After": str(round(tune.refresh_seconds))})
        # Counted here, not when the stream starts, so a burst cannot overshoot the cap.
        clients[0] += 1

        async def leave() -> None:
            clients[0] -= 1

        # Left in the stream's cleanup, not the generator's ``finally``: a browser that
        # goes away before the first chunk leaves the generator unstarted.
        return StreamWithCleanup(
            _stream(view, clock=clock, settings=tune, done=done), cleanup=leave,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def metrics_route(request: Request) -> Response:
        body = metrics.render() + bytes(generate_latest(fleet_registry))
        return Response(body, media_type=metrics.CONTENT_TYPE)

    async def health(request: Request) -> Response:
        store = view.store_status()
        if not store["reachable"]:
            return PlainTextResponse(f"shared state unreachable: {store['reason']}",
                                     status_code=503)
        return PlainTextResponse("ok")

    app = Starlette(routes=[
        Route("/", page, methods=["GET"]),
        Route("/static/{name}", static, methods=["GET"]),
        Route("/api/state", state, methods=["GET"]),
        Route("/events", events, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        Route("/healthz", health, methods=["GET"]),
    ])
    return GuardMiddleware(app, tune)


def _event(snapshot: dict[str, Any]) -> str:
    return f"event: state\ndata: {json.dumps(snapshot, separators=(',', ':'))}\n\n"


async def _stream(
    view: FleetView, *, clock: Clock, settings: DashboardSettings, done: asyncio.Event,
) -> AsyncIterator[str]:
    """One browser's event stream: a snapshot now, then one per burst of changes."""
    changed = asyncio.Event()
    view.on_change(changed.set)
    try:
        yield "retry: 2000\n\n"  # reconnect quickly if the server restarts
        yield _event(view.snapshot())
        while not done.is_set():
            changed.clear()
            waiters = {asyncio.ensure_future(changed.wait()), asyncio.ensure_future(done.wait())}
            try:
                await clock.wait_for(
                    asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED),
                    settings.refresh_seconds,
                )
            except TimeoutError:
                pass
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if done.is_set():
                break
            if changed.is_set():
                await clock.sleep(settings.coalesce_seconds)
            yield _event(view.snapshot())
    finally:
        view.remove_listener(changed.set)
