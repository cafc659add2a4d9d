"""Wiring of one gateway process: providers, prober, runtime, HTTP server.

The runtime comes from :func:`~kubemoot.runtime.builder.build_runtime` — the one
function that builds it for every caller — and each call goes through its call service,
so the gateway places, leases and releases calls exactly as the agents do. The gateway
probes the providers it was given and publishes their state to the store; on NATS,
other gateways and the operator see the same state and tickets.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubemoot.clock import Clock, SystemClock
from kubemoot.gateway.access import AccessLog
from kubemoot.gateway.app import GatewayApp, VirtualModels
from kubemoot.gateway.calls import CallDesk, error_line, shutting_down
from kubemoot.gateway.config import ProviderSource
from kubemoot.gateway.errors import error_response
from kubemoot.gateway.guard import Guard, GuardPolicy
from kubemoot.gateway.health import GatewayHealth
from kubemoot.gateway.keys import ApiKeys
from kubemoot.gateway.pinning import load_missing_pinned
from kubemoot.gateway.upstream import Upstream
from kubemoot.providers.factory import ProviderClients
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import KVStatePublisher, Prober
from kubemoot.providers.protocol import ProviderState
from kubemoot.runtime.builder import Runtime, build_runtime
from kubemoot.runtime.calls import CallRecord
from kubemoot.runtime.pinning import PINNED_CALLER, unpin, unpinned
from kubemoot.serving import HttpServer
from kubemoot.settings import GatewaySettings, ProcessSettings, RuntimeSettings
from kubemoot.store.bus import Bus
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import KV, Bucket, KeyExists, RevisionMismatch

__all__ = ["GatewayServer", "ProviderSource", "collect_less"]

log = logging.getLogger(__name__)

# How long opening a connection to an engine may take (a call's own timeout is longer).
_CONNECT_SECONDS = 10.0
# Connections the kernel queues before the gateway accepts them: calls come in bursts.
_LISTEN_BACKLOG = 1024


class _ShutdownCuts(logging.Filter):
    """uvicorn's words for the calls a shutdown cuts short, made one plain line.

    When the grace period ends, uvicorn cancels the requests still running and logs
    each cancellation as "Exception in ASGI application" with a traceback. A call cut
    short by SIGTERM is expected, not a bug: say so once, without the traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            return False  # one cancellation a request: already said by the line below
        if str(record.msg).startswith("Cancel %s running task"):
            record.msg = ("%s call(s) still running when the grace period ended were cut "
                          "short by the shutdown")
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class GatewayServer:
    """One gateway on ``host:port`` over a store; :meth:`start`, then :meth:`stop`."""

    def __init__(
        self,
        kv: KV,
        *,
        providers: Sequence[ProviderSource],
        host: str = "127.0.0.1",
        port: int = 11435,
        settings: GatewaySettings | None = None,
        runtime: RuntimeSettings | None = None,
        process: ProcessSettings | None = None,
        client_factory: ProviderClients | None = None,
        declared: dict[str, int | None] | None = None,
        keys: ApiKeys | None = None,
        virtual: VirtualModels | None = None,
        clock: Clock | None = None,
        on_call: Sequence[Callable[[CallRecord], None]] = (),
    ) -> None:
        self.kv = kv
        self.sources = list(providers)
        self.host, self.port = host, port
        self.settings = settings or GatewaySettings()
        # The waiter's own safety net is the longest budget a client may ask for; each
        # call's budget ends its wait earlier (CallDesk.start).
        base = runtime or RuntimeSettings()
        #: How often /readyz asks the store whether it still answers.
        self.store_check_seconds = (process or ProcessSettings()).store_check_seconds
        self.runtime = replace(base,
                               gpu_wait_limit_seconds=self.settings.max_wait_budget_seconds)
        self.declared = dict(declared or {})
        self.keys = keys
        self.virtual = virtual or VirtualModels()
        self.clock = clock or SystemClock()
        #: Where the gateway's provider clients come from: the entry point's factory
        #: (its timeouts), else one over the runtime settings it was given.
        self.client_factory = client_factory or ProviderClients.of(self.runtime,
                                                                    clock=self.clock)
        # Each finished call's attribution (the CLI adds the dashboard's call log here).
        self.on_call = list(on_call)
        self.clients: dict[str, OllamaProvider] = {}
        # provider → models kept loaded there, for every provider this gateway probes;
        # published with each probe's state
        self.pinned: dict[str, tuple[str, ...]] = {s.name: s.pinned for s in self.sources}
        # Run before each probe round (the CLI checks its config file's mtime here).
        self.before_probe: Callable[[], Awaitable[None]] | None = None
        self.app: GatewayApp | None = None
        self.stack: Runtime | None = None
        self.desk: CallDesk | None = None
        self.prober: Prober | None = None
        self._http: Upstream | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.health: GatewayHealth | None = None
        self.guard: Guard | None = None
        self._probing: asyncio.Task[None] | None = None
        self._web = HttpServer(host, port, drain_seconds=self.settings.drain_seconds,
                               backlog=_LISTEN_BACKLOG,
                               header_timeout=self.settings.header_timeout_seconds,
                               idle_timeout=self.settings.idle_timeout_seconds)

    @property
    def url(self) -> str:
        if not self._web.bound:
            raise RuntimeError("the gateway is not running")
        return self._web.url

    async def start(self) -> None:
        """Bind (``OSError`` when the address is taken), probe, wire, serve."""
        self._web.bind()
        try:
            await self._wire()
            assert self.desk is not None
            self.app = GatewayApp(self.desk, self.clients,
                                  declared=frozenset(self.declared), keys=self.keys,
                                  virtual=self.virtual, reprobe=self._reprobe)
            _install_once(logging.getLogger("uvicorn.error"), _ShutdownCuts)
            await self._web.start(_answer_when_cut(self._protected(self.app)))
        except BaseException:
            await self.stop()
            raise

    def _client(self, source: ProviderSource) -> OllamaProvider:
        return self.client_factory.client(
            source.name, source.endpoint, context_length=source.context_length,
            num_parallel=source.num_parallel, reserve_mib=source.reserve_mib,
            total_vram_mib=source.total_vram_mib,
            timeout=self.settings.listing_timeout_seconds)

    async def _wire(self) -> None:
        for source in self.sources:
            self.clients[source.name] = self._client(source)
        self._states = await self.kv.bucket(PROVIDER_STATE_BUCKET)
        self.prober = Prober(list(self.clients.values()), clock=self.clock,
                             publish=NewestStatePublisher(self._states,
                                                          providers=self.pinned),
                             interval_seconds=self.settings.provider_probe_seconds)
        for state in await self.prober.probe_all():
            if not state.ready:
                # said once here: otherwise a dead server shows only as "model not found"
                log.warning("provider %s (%s) did not answer its first probe: %s; the "
                            "gateway probes it again every %g s and uses it once it "
                            "answers", state.provider, state.endpoint, state.reason,
                            self.settings.provider_probe_seconds)

        declared = {m: mib for m, mib in self.declared.items() if mib is not None}
        runtime = self.stack = await build_runtime(
            self.kv, clock=self.clock, settings=self.runtime, clients=self.clients,
            declared=declared, bus=_bus_of(self.kv))
        # Follow the buckets' watches so each placement reads only what changed.
        await runtime.start()
        runtime.calls.after_load = self._reprobe
        runtime.calls.idle_retry_seconds = self.settings.provider_probe_seconds
        runtime.calls.listeners.extend(self.on_call)
        self._http = Upstream(timeout=self.settings.call_timeout_seconds,
                              connect_timeout=_CONNECT_SECONDS,
                              connections=self.settings.upstream_connections)
        self.desk = CallDesk(runtime, self._http, self.settings, pinned=self.pinned)
        self._ensure_probe_loop()

    def _protected(self, app: GatewayApp) -> ASGIApp:
        """``app`` with the probe routes, behind the access log and the guard."""
        assert self.stack is not None
        health = self.health = GatewayHealth(
            self.stack, self.stack.states,
            check_seconds=self.store_check_seconds,
            unready_after_failures=self.settings.unready_after_failures, keys=self.keys)
        health.start()
        app.app.router.routes[0:0] = health.routes()  # first: they win over app's own
        guard = self.guard = Guard(app.asgi, GuardPolicy.of(self.settings,
                                                           bound_host=self.host),
                                   store_lost=health.store_lost)
        return AccessLog(guard, on_outcome=health.outcome)

    def _ensure_probe_loop(self) -> None:
        """Start the probe loop once there is something to probe or a file to watch (a
        gateway of NATS-published providers only has nothing to do on a tick)."""
        if self._probing is None and (self.clients or self.before_probe is not None):
            self._probing = asyncio.get_running_loop().create_task(self._probe_loop())
            self._tasks.append(self._probing)

    async def _probe_loop(self) -> None:
        """Every probe interval: the ``before_probe`` hook, a probe of every provider,
        then the pinned models their servers lost loaded again."""
        assert self.prober is not None
        # Every provider was just probed by the start (or the reload that started this
        # loop): load the pinned models it found missing, then wait an interval before
        # probing again, so a call right after the start meets the state it probed.
        await self.keep_pinned()
        while True:
            await self.clock.sleep(self.settings.provider_probe_seconds)
            if self.before_probe is not None:
                try:
                    await self.before_probe()
                except Exception:  # a hook's bug must not stop the probes
                    log.exception("gateway: the before-probe hook failed")
            await self.prober.probe_all()
            await self.keep_pinned()

    async def keep_pinned(self) -> list[str]:
        """Load the pinned models their ready servers do not hold (``provider/model``)."""
        if self.desk is None or self.prober is None or not any(self.pinned.values()):
            return []
        states = {name: self.prober.last_states[name] for name in self.clients
                  if name in self.prober.last_states}
        return await load_missing_pinned(self.desk, states, self.pinned)

    async def reconfigure(
        self,
        *,
        providers: Sequence[ProviderSource],
        declared: Mapping[str, int | None],
        virtual: VirtualModels | None = None,
        keys: ApiKeys | None = None,
        settings: GatewaySettings | None = None,
    ) -> list[str]:
        """Take a new fleet without a restart (a config reload); what changed, in words.

        Servers added are probed at once, so a call may land on them as soon as this
        returns; a removed server's published state is deleted so that no call is placed
        there any more (calls already on it finish). Changed servers get a new client.
        """
        assert self.prober is not None and self.app is not None and self.desk is not None
        assert self.stack is not None
        changes: list[str] = []
        new = {s.name: s for s in providers}
        old = {s.name: s for s in self.sources}
        for name in sorted(old.keys() - new.keys()):
            self.pinned.pop(name, None)  # first: a probe under way publishes it no more
            client = self.clients.pop(name)
            with contextlib.suppress(Exception):
                await client.close()
            with contextlib.suppress(Exception):
                await self._states.delete(encode_token(name))
            changes.append(f"removed server {name}")
        fresh = []
        for name, source in new.items():
            if old.get(name) == source:
                continue
            if name in old and replace(old[name], pinned=source.pinned) == source:
                changes.append(f"server {name} pins {', '.join(source.pinned) or 'nothing'}")
                continue
            previous = self.clients.get(name)
            self.clients[name] = self._client(source)
            if previous is not None:
                with contextlib.suppress(Exception):
                    await previous.close()
            fresh.append(self.clients[name])
            changes.append(f"{'changed' if name in old else 'added'} server {name}")
        self.sources = list(providers)
        dropped = unpinned(self.pinned, {s.name: s.pinned for s in self.sources})
        self.pinned.clear()
        self.pinned.update({s.name: s.pinned for s in self.sources})
        self.prober.clients = list(self.clients.values())
        for model, mib in declared.items():
            if mib is not None and self.declared.get(model) != mib:
                self.stack.planner.occupancy.declare(model, mib)
        if dict(declared) != self.declared:
            changes.append("declared model sizes")
        self.declared = dict(declared)
        self.app.declared = frozenset(self.declared)
        if virtual is not None:
            self.virtual = self.app.virtual = virtual
        if (keys is None) != (self.keys is None):
            changes.append("API keys " + ("off" if keys is None else "on"))
        self.keys = self.app.keys = keys
        if settings is not None and settings != self.settings:
            self.settings = self.desk.settings = settings
            self.prober.interval_seconds = settings.provider_probe_seconds
            changes.append("limits")
        self._ensure_probe_loop()
        await asyncio.gather(*(self.prober.probe_one(c) for c in fresh))
        # read again at the next placement, not when the watch gets round to it
        for name in old.keys() ^ new.keys() | {c.name for c in fresh}:
            self.stack.view.invalidate(name)
        await self.keep_pinned()
        await self._unpin(dropped)
        return changes

    async def _unpin(self, dropped: Sequence[tuple[str, str]]) -> None:
        """The copies of pins withdrawn get the keep-alive any call gets (not forever)."""
        assert self.stack is not None and self.desk is not None
        keep_alive = self.desk.keep_alive(None)
        for provider, model in dropped:
            client = self.clients.get(provider)
            if client is None:
                continue
            await unpin(self.stack.planner, provider=provider, model=model,
                        holder=self.stack.calls.holder_id(PINNED_CALLER, "unpin", "unpin"),
                        renew=partial(client.preload, model, keep_alive=keep_alive))
            await self._reprobe(provider)  # its state shows the copy's new expiry

    async def _reprobe(self, provider: str) -> None:
        client = self.clients.get(provider)
        if client is not None and self.prober is not None:
            await self.prober.probe_one(client)

    async def wait(self) -> None:
        """Serve until the server stops (Ctrl-C in the host program cancels this)."""
        await self._web.wait()

    async def stop(self) -> None:
        """Stop placing calls, let started replies drain, release what the calls still
        hold, then close clients."""
        if self.desk is not None:
            # at once: calls waiting for capacity are answered 503, none is sent now
            self.desk.drain()
        await self._web.stop()
        if self.health is not None:
            await self.health.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # No call of ours is closed here: uvicorn has ended every request by now, and
        # each ending has its own home that closed its call (the reader's finally, the
        # stream's cleanup, the open's except); what they started is awaited below.
        if self.stack is not None:
            # and wait (bounded) for releases already under way, a call the shutdown cut
            # among them, before the store closes under them
            await self.stack.calls.close_all()
            await self.stack.close()
        if self._http is not None:
            await self._http.aclose()
        for client in self.clients.values():
            with contextlib.suppress(Exception):
                await client.close()

    async def __aenter__(self) -> GatewayServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


#: The collector's first threshold in a gateway process (Python's default is 700).
COLLECTION_THRESHOLD = 10_000


def collect_less() -> None:
    """Tune the cycle collector for a gateway process that has started (its own process:
    the setting is the interpreter's).

    Each call allocates many short-lived objects that reference counting frees. At
    Python's default threshold the collector still ran a pass every few dozen calls,
    and each pass of an older generation walked everything the process built while
    starting (the modules, the runtime, the web stack). What exists once the gateway
    serves is frozen, so no pass walks it again, and a higher threshold makes fewer
    passes over what the calls leave (``bench/gateway.py --count-calls`` prints them).
    Frozen objects are still freed when their last reference goes; only a cycle among
    them would be kept.
    """
    gc.freeze()
    gc.set_threshold(COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


def _answer_when_cut(app: ASGIApp) -> ASGIApp:
    """``app``, answering 503 in its route family's shape to a request the shutdown cuts.

    uvicorn cancels the requests still running when its grace period ends — nothing else
    cancels a handler — and would answer a bare text 500. A client (or the load
    balancer in front of several replicas) should rather learn that this replica is
    going away and that retrying elsewhere is fine.
    """
    cut = shutting_down()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None

        async def tracked(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message  # its media type is read only if the request is cut
            await send(message)

        try:
            await app(scope, receive, tracked)
        except asyncio.CancelledError:
            if scope["type"] == "http" and start is None:
                answer = error_response(cut, openai=str(scope["path"]).startswith("/v1/"))
                with contextlib.suppress(Exception):
                    await answer(scope, receive, send)
            elif (scope["type"] == "http" and start is not None
                  and (last := _cut_stream_line(_media_type(start)))):
                # a stream already under way: its last chunk says it was cut (DESIGN §9)
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.body", "body": last,
                                "more_body": False})
            raise

    return guarded


_CUT = "the gateway shut down before the answer was complete; retry the call"


def _media_type(start: Message) -> str:
    for name, value in start.get("headers", ()):
        if bytes(name).lower() == b"content-type":
            return bytes(value).decode("latin-1").split(";")[0].strip().lower()
    return ""


def _cut_stream_line(media_type: str) -> bytes | None:
    """The final chunk of a stream the shutdown cuts, in its own framing (None: the
    reply is no stream, and a cut body is all a client can be told)."""
    if media_type == "application/x-ndjson":
        return error_line(_CUT)
    if media_type == "text/event-stream":
        error = {"error": {"message": _CUT, "type": "server_error", "code": "shutdown"}}
        return f"data: {json.dumps(error, separators=(',', ':'))}\n\n".encode()
    return None


def _install_once(logger: logging.Logger, kind: type[logging.Filter]) -> None:
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


class NewestStatePublisher(KVStatePublisher):
    """Publishes a provider's state unless a newer probe's is already stored.

    Several gateway replicas may probe the same provider. A probe that began before a
    call loaded a model and was published after that call's own re-probe would show the
    card emptier than it is once the call's ticket is gone — room another call would
    then fill, making the engine evict on its own. The stored document's
    ``lastProbedAt`` orders probes; a compare-and-set keeps the check and the write
    together.

    ``providers`` (provider → models pinned there), when given, is the gateway's
    current fleet: each state carries its pins, and the state of a provider a reload
    took out is not published again by a probe that was already under way.
    """

    def __init__(self, bucket: Bucket, *,
                 providers: Mapping[str, Sequence[str]] | None = None) -> None:
        super().__init__(bucket)
        self._providers = providers

    async def __call__(self, state: ProviderState) -> None:
        if self._providers is not None:
            if state.provider not in self._providers:
                return  # taken out of the fleet while its probe ran
            state.pinned = list(self._providers[state.provider])
        key = encode_token(state.provider)
        data = state.to_json()
        for _ in range(_PUBLISH_ATTEMPTS):
            entry = await self.bucket.get(key)
            try:
                if entry is None:
                    await self.bucket.create(key, data)
                    return
                stored = _probed_at(entry.value)
                if (stored is not None and state.last_probed_at is not None
                        and stored > state.last_probed_at):
                    return  # a newer probe is stored: this one is stale
                await self.bucket.update(key, data, expected_revision=entry.revision)
                return
            except (KeyExists, RevisionMismatch):
                continue  # another replica published meanwhile: judge again
        log.warning("gateway: the state of %s changed too often to publish", state.provider)


_PUBLISH_ATTEMPTS = 8


def _probed_at(data: bytes) -> float | None:
    try:
        return ProviderState.from_json(data).last_probed_at
    except ValueError:
        return None  # unreadable: overwrite it


def _bus_of(kv: KV) -> Bus | None:
    """The bus replicas sharing NATS hand contended ticket operations over, to the
    provider's combiner (:mod:`kubemoot.runtime.ticket_delegation`); on the embedded
    store one process has no other to combine with."""
    from kubemoot.store.nats import NatsKV  # imported on the NATS path only
    from kubemoot.store.natsbus import NatsBus

    return NatsBus(kv) if isinstance(kv, NatsKV) else None
