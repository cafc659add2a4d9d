"""The gateway's outer wall: who may call, how many at once, how much body is held.

One ASGI middleware in front of every route (DESIGN §9 "Security", "When things
break"), in the order a request meets them:

1. **Host and Origin** (:mod:`kubemoot.webguard`): a foreign ``Host`` (DNS rebinding)
   or a browser ``Origin`` not on the allow list (CSRF) is a 403. An allowed origin gets
   the CORS headers a browser needs to read the reply, and its preflight an answer.
2. **The store**: while the shared store does not answer, every call would fail on its
   tickets; it is refused at once with 503 and ``Retry-After`` instead of waiting out
   its budget on timeouts.
3. **Concurrency**: past ``max_concurrent_requests`` requests in flight, 503 with
   ``Retry-After`` at once; a bounded gateway sheds load instead of queueing sockets.
4. **Buffered bodies**: every request's body bytes count against one budget while the
   request lives; the read that would pass ``max_buffered_bytes`` fails with a 503.

Probes (``/``, ``/healthz``, ``/readyz``) and ``/metrics`` pass the limits 2–4: they
must answer when the gateway is busiest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubemoot import metrics
from kubemoot.gateway.errors import GatewayError, error_response
from kubemoot.settings import GatewaySettings
from kubemoot.webguard import host_allowed, host_name, origin_allowed

__all__ = ["UNLIMITED_PATHS", "Guard", "GuardPolicy"]

_DEFAULTS = GatewaySettings()

#: Paths that a load balancer or scraper must reach however busy the gateway is.
UNLIMITED_PATHS = frozenset({"/", "/healthz", "/readyz", "/metrics"})

_CORS_METHODS = "GET, HEAD, POST, DELETE, OPTIONS"
_CORS_HEADERS = "Authorization, Content-Type, X-Kubemoot-Wait-Budget, X-Requested-With"
_EXPOSED = ("X-Kubemoot-Provider, X-Kubemoot-Model, X-Kubemoot-Action, "
            "X-Kubemoot-Wait-Seconds, X-Kubemoot-Evicted, Retry-After")


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    """What the guard allows: the extra hosts and origins, and the limits."""

    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_concurrent: int = _DEFAULTS.max_concurrent_requests
    max_buffered_bytes: int = _DEFAULTS.max_buffered_bytes
    #: seconds a client refused for load should wait before it tries again
    retry_after: int = 1

    @classmethod
    def of(cls, settings: GatewaySettings, *, bound_host: str) -> GuardPolicy:
        """The policy of a gateway bound to ``bound_host`` with ``settings``."""
        hosts = [*settings.allowed_hosts, host_name(bound_host)]
        return cls(allowed_hosts=tuple(h for h in hosts if h),
                   allowed_origins=settings.allowed_origins,
                   max_concurrent=settings.max_concurrent_requests,
                   max_buffered_bytes=settings.max_buffered_bytes,
                   retry_after=max(1, round(settings.provider_probe_seconds / 5)))


@dataclass(slots=True)
class Guard:
    """The middleware; ``store_lost()`` says why the store is away, or ``None``."""

    app: ASGIApp
    policy: GuardPolicy
    store_lost: Callable[[], str | None] = lambda: None
    in_flight: int = field(default=0, init=False)
    buffered: int = field(default=0, init=False)
    #: Host header → allowed: every request of a client names the same host, and
    #: judging one parses it as an address. Bounded: cleared when full, so Host headers
    #: made up by a client cannot grow it.
    _hosts: dict[str, bool] = field(default_factory=dict, init=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope["path"])
        host, origin = _host_and_origin(scope["headers"])
        refusal = self._refusal(host, origin)
        if refusal is not None:
            await _answer(refusal, scope, receive, send)
            return
        if origin is not None and scope["method"] == "OPTIONS":
            await _preflight(origin)(scope, receive, send)
            return
        if origin is not None:
            send = _with_cors(send, origin)
        if path in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        lost = self.store_lost()
        if lost is not None:
            await _answer(GatewayError(
                503, f"the shared store does not answer ({lost}); the gateway cannot hold "
                "tickets until it is back", code="store_unavailable",
                headers={"Retry-After": str(self.policy.retry_after)}), scope, receive, send)
            return
        if self.in_flight >= self.policy.max_concurrent:
            metrics.GATEWAY_SHED.labels(reason="concurrency").inc()
            await _answer(GatewayError(
                503, f"the gateway is serving its limit of {self.policy.max_concurrent} "
                "requests at once; retry shortly", code="overloaded",
                headers={"Retry-After": str(self.policy.retry_after)}), scope, receive, send)
            return
        self.in_flight += 1
        held = 0

        async def counted() -> Message:
            nonlocal held
            message = await receive()
            size = len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if size:
                if self.buffered + size > self.policy.max_buffered_bytes:
                    metrics.GATEWAY_SHED.labels(reason="buffered-bodies").inc()
                    raise GatewayError(
                        503, "the gateway holds as many request bodies as it may "
                        f"({self.policy.max_buffered_bytes} bytes); retry shortly",
                        code="overloaded",
                        headers={"Retry-After": str(self.policy.retry_after)})
                self.buffered += size
                held += size
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            self.in_flight -= 1
            self.buffered -= held

    def _host_allowed(self, host: str) -> bool:
        allowed = self._hosts.get(host)
        if allowed is None:
            if len(self._hosts) >= _HOSTS_KEPT:
                self._hosts.clear()
            allowed = self._hosts[host] = host_allowed(host,
                                                       allowed=self.policy.allowed_hosts)
        return allowed

    def _refusal(self, host: str, origin: str | None) -> GatewayError | None:
        if not self._host_allowed(host):
            metrics.GATEWAY_SHED.labels(reason="host").inc()
            return GatewayError(403, "this gateway answers only to loopback, IP addresses, "
                                "the name it listens on and the names given with "
                                "--allow-host", code="forbidden_host")
        if origin is not None and not origin_allowed(
                origin, allowed=self.policy.allowed_origins):
            metrics.GATEWAY_SHED.labels(reason="origin").inc()
            return GatewayError(403, f"requests from the web origin {origin[:80]!r} are "
                                "not allowed; start the gateway with --allow-origin to "
                                "allow it", code="forbidden_origin")
        return None


_HOSTS_KEPT = 64


def _host_and_origin(raw: Iterable[tuple[bytes, bytes]]) -> tuple[str, str | None]:
    """The ``Host`` and ``Origin`` headers (the last of each, as a dict of them would
    keep); only these two are decoded."""
    host, origin = b"", None
    for key, value in raw:
        if key == b"host":
            host = value
        elif key == b"origin":
            origin = value
    return host.decode("latin-1"), None if origin is None else origin.decode("latin-1")


async def _answer(error: GatewayError, scope: Scope, receive: Receive, send: Send) -> None:
    response = error_response(error, openai=str(scope["path"]).startswith("/v1/"))
    await response(scope, receive, send)


def _preflight(origin: str) -> Response:
    return Response(status_code=204, headers={
        "Access-Control-Allow-Origin": origin, "Vary": "Origin",
        "Access-Control-Allow-Methods": _CORS_METHODS,
        "Access-Control-Allow-Headers": _CORS_HEADERS, "Access-Control-Max-Age": "600"})


def _with_cors(send: Send, origin: str) -> Send:
    extra = [(b"access-control-allow-origin", origin.encode("latin-1")),
             (b"vary", b"Origin"),
             (b"access-control-expose-headers", _EXPOSED.encode("latin-1"))]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return sending
