"""The gateway's routes (DESIGN §9): Ollama's API and the OpenAI-compatible API.

Every route answers JSON, errors included: a :class:`GatewayError` raised anywhere in a
handler becomes the route family's error shape, an unknown route a 404, and an
unexpected exception a 500 with one line (the traceback goes to the log, never to the
client), so the gateway keeps serving whatever a client sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kubemoot import __version__, metrics
from kubemoot.gateway import completions as legacy
from kubemoot.gateway import openai as oai
from kubemoot.gateway.access import INFERENCE_ROUTES
from kubemoot.gateway.calls import CallDesk, CallEnds, PlacedCall
from kubemoot.gateway.catalogue import known_models, resolve_name
from kubemoot.gateway.errors import GatewayError, error_response, refusal_error, unknown_model
from kubemoot.gateway.jsoncodec import RawJsonReply, dumps, loads
from kubemoot.gateway.keys import ANONYMOUS, ApiKeys
from kubemoot.gateway.listings import created_epoch, merge_tags
from kubemoot.gateway.requests import InferenceRequest, header, model_name, read_json
from kubemoot.gateway.upstream import UpstreamError
from kubemoot.providers.protocol import ProviderClient, ProviderError
from kubemoot.runtime.placement import CandidateModel
from kubemoot.runtime.refusals import ProviderDown, providers_down
from kubemoot.runtime.snapshot import FleetSnapshot
from kubemoot.serving import StreamWithCleanup
from kubemoot.store.protocol import StoreError

__all__ = ["GatewayApp", "VirtualModels"]

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]

#: How long a call runs before a task starts watching for its client leaving (the
#: latest a leaving client is noticed; a call that ends sooner never needs the task).
_WATCH_AFTER_SECONDS = 0.05


class VirtualModels:
    """Virtual model names (ModelClass) → ranked candidates; none until one is given."""

    def names(self) -> list[str]:
        return []

    def candidates(self, name: str) -> list[CandidateModel] | None:
        return None


@dataclass(slots=True)
class GatewayApp:
    """The Starlette application over one :class:`CallDesk`."""

    desk: CallDesk
    clients: Mapping[str, ProviderClient]  # the providers this gateway probes
    declared: Collection[str] = ()  # models the bundle's Model resources declare
    keys: ApiKeys | None = None
    virtual: VirtualModels = field(default_factory=VirtualModels)
    reprobe: Callable[[str], Awaitable[None]] | None = None
    app: Starlette = field(init=False)
    #: :attr:`app` with the inference routes looked up by path first (:class:`_Direct`).
    asgi: ASGIApp = field(init=False)
    # Every model a provider has listed since start-up: a provider that cannot be
    # probed for a moment publishes no list, and its models are then busy, not typos.
    _seen: set[str] = field(default_factory=set, init=False)
    _listed: set[str] = field(default_factory=set, init=False)  # providers seen ready
    # What _seen and _listed were last brought up to date from: the providers' probed
    # states change with probes, not with the tickets every call moves.
    _learned_from: tuple[object, ...] = field(default=(), init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        o, a = self._ollama, self._openai
        routes = [
            Route("/", self._root, methods=["GET", "HEAD"]),
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/api/version", o(self._version), methods=["GET", "HEAD"]),
            Route("/api/tags", o(self._tags), methods=["GET"]),
            Route("/api/ps", o(self._ps), methods=["GET"]),
            Route("/api/show", o(self._show), methods=["POST"]),
            # the handler itself, its route's facts bound: a method that only passed
            # them on was one more frame for each of the call's steps to pass through
            Route("/api/chat", o(partial(self._ollama_call, kind="chat", path="/api/chat")),
                  methods=["POST"]),
            Route("/api/generate", o(partial(self._ollama_call, kind="generate",
                                             path="/api/generate")), methods=["POST"]),
            Route("/api/embed", o(partial(self._ollama_call, kind="embed",
                                          path="/api/embed")), methods=["POST"]),
            Route("/api/embeddings", o(partial(self._ollama_call, kind="embed",
                                               path="/api/embeddings",
                                               legacy_embeddings=True)), methods=["POST"]),
            Route("/v1/models", a(self._models), methods=["GET"]),
            Route("/v1/models/{model:path}", a(self._model), methods=["GET"]),
            Route("/v1/chat/completions", a(self._completions), methods=["POST"]),
            Route("/v1/completions", a(self._legacy_completions), methods=["POST"]),
            Route("/v1/embeddings", a(self._v1_embeddings), methods=["POST"]),
        ]
        for path, methods in (("/api/pull", ["POST"]), ("/api/push", ["POST"]),
                              ("/api/create", ["POST"]), ("/api/copy", ["POST"]),
                              ("/api/delete", ["DELETE", "POST"]),
                              ("/api/blobs/{digest}", ["POST", "HEAD"])):
            routes.append(Route(path, o(self._not_implemented), methods=methods))
        self.app = Starlette(routes=routes, exception_handlers={
            HTTPException: self._http_exception})
        self.asgi = _Direct(self.app, [r for r in routes if r.path in INFERENCE_ROUTES])

    # -- the error boundary --------------------------------------------------------

    def _guard(self, handler: Handler, *, openai: bool) -> Handler:
        async def guarded(request: Request) -> Response:
            try:
                # the caller where request.state keeps it (the scope's state), without
                # building a State for each request: the access log reads it there too
                request.scope.setdefault("state", {})["caller"] = self._caller(request)
                response = await handler(request)
            except GatewayError as error:
                response = error_response(error, openai=openai)
            except StoreError as error:
                # the store went away mid-call: retrying soon helps, a 500 would not say so
                log.warning("gateway: %s %s: the shared store failed: %s", request.method,
                            request.url.path, error)
                response = error_response(
                    GatewayError(503, f"the shared store did not answer: {error}",
                                 code="store_unavailable", headers={"Retry-After": "1"}),
                    openai=openai)
            except Exception:
                log.exception("gateway: %s %s failed", request.method, request.url.path)
                response = error_response(
                    GatewayError(500, "the gateway failed on this request; see its log",
                                 code="internal_error"), openai=openai)
            return response  # counted by route template in gateway/access.py
        return guarded

    def _ollama(self, handler: Handler) -> Handler:
        return self._guard(handler, openai=False)

    def _openai(self, handler: Handler) -> Handler:
        return self._guard(handler, openai=True)

    def _caller(self, request: Request) -> str:
        if self.keys is None:
            return ANONYMOUS
        return self.keys.caller(header(request, b"authorization"))

    async def _http_exception(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = (f"no route {request.method} {request.url.path} on this gateway"
                   if status in (404, 405) else str(getattr(exc, "detail", exc)))
        return error_response(GatewayError(status, message),
                              openai=request.url.path.startswith("/v1/"))

    # -- plain answers -------------------------------------------------------------

    async def _root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running (kubemoot gateway)")

    async def _metrics(self, request: Request) -> Response:
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)

    async def _version(self, request: Request) -> Response:
        for endpoint in await self._endpoints():
            with contextlib.suppress(UpstreamError, ValueError, AttributeError):
                reply = await self._get(endpoint, "/api/version")
                if isinstance(reply.get("version"), str):
                    return JSONResponse({"version": reply["version"]})
        return JSONResponse({"version": __version__})

    async def _not_implemented(self, request: Request) -> Response:
        what = request.url.path.removeprefix("/api/").split("/")[0]
        raise GatewayError(501, f"{what} is not supported by the kubemoot gateway: manage "
                           "models on each provider (fleet-wide model management does "
                           "not exist yet)", code="not_implemented")

    # -- listings ------------------------------------------------------------------

    async def _endpoints(self) -> list[str]:
        fleet = await self.desk.runtime.view.snapshot()
        return [p.state.endpoint for p in fleet.providers if p.state.ready]

    async def _get(self, endpoint: str, path: str) -> dict[str, Any]:
        response = await self.desk.http.get(
            endpoint.rstrip("/") + path, timeout=self.desk.settings.listing_timeout_seconds)
        try:
            value = await response.json()
        finally:
            await response.aclose()
        if response.status >= 400:
            raise UpstreamError(f"{path} answered HTTP {response.status}")
        if not isinstance(value, dict):
            raise ValueError(f"{path} answered {type(value).__name__}")
        return value

    async def _gather(self, path: str) -> list[tuple[str, dict[str, Any]]]:
        fleet = await self.desk.runtime.view.snapshot()
        ready = [p.state for p in fleet.providers if p.state.ready]

        async def one(endpoint: str) -> dict[str, Any] | None:
            try:
                return await self._get(endpoint, path)
            except (UpstreamError, ValueError) as error:
                log.warning("gateway: %s of %s failed: %s", path, endpoint, error)
                return None

        replies = await asyncio.gather(*(one(s.endpoint) for s in ready))
        return [(s.provider, r) for s, r in zip(ready, replies, strict=True) if r is not None]

    async def _tag_entries(self) -> list[dict[str, Any]]:
        return merge_tags(await self._gather("/api/tags"), self.virtual.names())

    async def _tags(self, request: Request) -> Response:
        return JSONResponse({"models": await self._tag_entries()})

    async def _ps(self, request: Request) -> Response:
        models = []
        for provider, reply in await self._gather("/api/ps"):
            for entry in reply.get("models") or []:
                if isinstance(entry, dict):
                    models.append({**entry, "provider": provider})
        return JSONResponse({"models": models})

    async def _models(self, request: Request) -> Response:
        entries = await self._tag_entries()
        return JSONResponse({"object": "list",
                             "data": [oai.model_entry(str(e["name"]),
                                                      created=created_epoch(e.get("modified_at")))
                                      for e in entries]})

    async def _model(self, request: Request) -> Response:
        name = request.path_params["model"]
        await self._candidates(name)
        # dated as in the list, so the one model and its list entry agree
        tagged = name if ":" in name else f"{name}:latest"
        created = next((created_epoch(e.get("modified_at")) for e in await self._tag_entries()
                        if e.get("name") in (name, tagged)), 0)
        return JSONResponse(oai.model_entry(name, created=created))

    async def _show(self, request: Request) -> Response:
        body = await read_json(request, limit=self.desk.settings.max_body_bytes)
        name = model_name(body)
        candidates = await self._candidates(name)
        model = candidates[0].model
        fleet = await self.desk.runtime.view.snapshot()
        for p in fleet.providers:
            if p.state.ready and (model in p.state.disk_sizes_mib or p.is_resident(model)):
                try:
                    response = await self.desk.http.post(
                        p.state.endpoint.rstrip("/") + "/api/show",
                        dumps({**body, "model": model}),
                        timeout=self.desk.settings.listing_timeout_seconds)
                    try:
                        content = await response.read()
                    finally:
                        await response.aclose()
                except UpstreamError as error:
                    log.warning("gateway: /api/show on %s failed: %s", p.name, error)
                    continue  # another provider that has the model may answer
                return Response(content, status_code=response.status,
                                media_type="application/json")
        # the name is known (_candidates said so): its providers are away, not the model
        raise GatewayError(503, f"no provider that has {model} answers now",
                           code="provider_unavailable", headers={"Retry-After": "5"})

    # -- models --------------------------------------------------------------------

    async def _candidates(self, name: str) -> list[CandidateModel]:
        """The call's candidate list: a virtual name's, or the one model named."""
        virtual = self.virtual.candidates(name)
        if virtual:
            return virtual
        # A model seen before, with providers in view: the answer below would be the same
        # (what was seen is never forgotten), without building the fleet snapshot that
        # the previous call's ticket made stale. The planner builds its own.
        if self.desk.runtime.view.has_providers and (
                seen := resolve_name(name, self._seen)) is not None:
            return [CandidateModel(seen)]
        fleet = await self.desk.runtime.view.snapshot()
        if not fleet.providers:
            raise GatewayError(503, "no provider has published its state yet",
                               code="no_provider", headers={"Retry-After": "5"})
        self._learn(fleet)
        model = resolve_name(name, self._seen)
        if model is None:
            # A server that has not answered since start-up has listed nothing: the name
            # may be its model, so that is a 503, never a 404 (DESIGN §9). One whose list
            # was seen before it went away does not offer the name.
            down = [p for p in providers_down(fleet, [name]) if p not in self._listed]
            if down:
                retry = max(1, math.ceil(self.desk.settings.provider_probe_seconds))
                raise refusal_error(ProviderDown(tuple(down)), name=f'"{name}"', budget=0,
                                    retry_after=retry)
            raise unknown_model(name)
        return [CandidateModel(model)]

    def _learn(self, fleet: FleetSnapshot) -> None:
        """Add what ``fleet`` lists to the models and providers seen since start-up."""
        source = (self.declared, *(p.state for p in fleet.providers))
        if len(source) == len(self._learned_from) and all(
                a is b for a, b in zip(source, self._learned_from, strict=True)):
            return  # no probe and no reload since: nothing new to learn
        self._learned_from = source
        self._seen |= known_models(fleet, self.declared)
        self._listed |= {p.name for p in fleet.providers if p.state.ready}

    # -- inference -----------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the app serves on, asked for once: on Python 3.11 each
        ``asyncio.get_running_loop()`` makes a system call (getpid), about a microsecond
        here, and every call asked several times. Asked again only once that loop has
        closed (an app served on a later loop, as tests do)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def _start(self, request: Request, req: InferenceRequest, path: str, *,
                     legacy_embeddings: bool = False) -> PlacedCall:
        """Place the call and open its upstream request, while watching the client:
        uvicorn does not cancel a handler when its client disconnects, so a task
        listens for the disconnect and ends the wait or the upstream request."""
        candidates = await self._candidates(req.model)
        budget = self.desk.budget(header(request, b"x-kubemoot-wait-budget"))
        ends = CallEnds()

        async def watch_disconnect() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    ends.client_left()
                    return

        # The watcher is a task, and most calls are placed and answered by the engine
        # before a client could leave: it starts only for a call still going after
        # _WATCH_AFTER_SECONDS, so a leaving client is noticed at most that much later.
        watcher: asyncio.Task[None] | None = None

        loop = self._running_loop()

        def watch() -> None:
            nonlocal watcher
            watcher = loop.create_task(watch_disconnect())

        timer = loop.call_later(_WATCH_AFTER_SECONDS, watch)
        try:
            return await self.desk.start(req, candidates, caller=request.scope["state"]["caller"],
                                         budget=budget, ends=ends, path=path,
                                         legacy_embeddings=legacy_embeddings)
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    async def _ollama_call(self, request: Request, kind: str, path: str, *,
                           legacy_embeddings: bool = False) -> Response:
        body = await read_json(request, limit=self.desk.settings.max_body_bytes)
        req = InferenceRequest.parse(kind, body)
        if req.is_load_request and req.keep_alive == 0:
            return await self._unload(req)
        call = await self._start(request, req, path, legacy_embeddings=legacy_embeddings)
        if req.stream:
            return _call_stream(call, call.lines(), media_type="application/x-ndjson")
        _, raw = await call.answer()  # checked whole JSON: its bytes go to the client as they are
        return RawJsonReply(raw, call.raw_headers())

    async def _unload(self, req: InferenceRequest) -> Response:
        """``keep_alive: 0`` with no prompt: unload the model where no call uses it.

        A copy with a call in flight (a ticket) is left alone: the client's wish never
        overrules live work, the same rule the scheduler's own evictions follow.
        """
        candidates = await self._candidates(req.model)
        model = candidates[0].model
        fleet = await self.desk.runtime.view.snapshot()
        for name, client in self.clients.items():
            # the engine itself says whether it holds the model (published state may lag
            # a load that just finished); the shared tickets say whether a call uses it
            try:
                held = any(m.name == model for m in (await client.probe()).loaded_models)
            except ProviderError as error:
                log.warning("gateway: probing %s before an unload failed: %s", name, error)
                continue
            p = fleet.provider(name)
            if not held or (p is not None and (p.in_flight(model) or model in p.state.pinned)):
                continue  # in use, or pinned there: a client's unload does not overrule
            try:
                await client.unload(model)
            except ProviderError as error:
                log.warning("gateway: unloading %s on %s failed: %s", model, name, error)
            if self.reprobe is not None:
                await self.reprobe(name)
        created = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        payload: dict[str, Any] = {"model": model, "created_at": created, "done": True,
                                   "done_reason": "unload"}
        if req.kind == "chat":
            payload["message"] = {"role": "assistant", "content": ""}
        else:
            payload["response"] = ""
        return JSONResponse(payload)

    # -- OpenAI --------------------------------------------------------------------

    async def _completions(self, request: Request) -> Response:
        body = await read_json(request, limit=self.desk.settings.max_body_bytes)
        native = oai.chat_body(body)
        req = InferenceRequest.parse("chat", native)
        call = await self._start(request, req, "/api/chat")
        call_id = oai.new_id()
        model = _answered_by(call, req)
        if not req.stream:
            reply = await call.json()
            if not isinstance(reply, dict):
                raise GatewayError(502, "the provider's answer is not an object")
            return RawJsonReply(dumps(oai.chat_completion(reply, model=model,
                                                          call_id=call_id)),
                                call.raw_headers())
        usage = oai.include_usage(body)

        async def events() -> AsyncIterator[bytes]:
            first, done = True, False
            async for raw in call.lines():
                try:
                    line = loads(raw)  # one whole line
                except ValueError:
                    continue
                if not isinstance(line, dict):
                    continue
                if "error" in line:
                    error = {"error": {"message": str(line["error"]), "type": "server_error",
                                       "code": "provider_error"}}
                    yield _sse(error)
                    break
                yield _sse(oai.chat_chunk(line, model=model, call_id=call_id, first=first))
                first = False
                if line.get("done"):
                    done = True
                    if usage:
                        yield _sse(oai.usage_chunk(line, model=model, call_id=call_id))
            else:
                if not done:  # an Ollama stream ends with its done line: this one is cut
                    yield _sse(oai.unfinished(call.placement.provider))
            yield b"data: [DONE]\n\n"

        return _call_stream(call, events(), media_type="text/event-stream")

    async def _legacy_completions(self, request: Request) -> Response:
        body = await read_json(request, limit=self.desk.settings.max_body_bytes)
        req = InferenceRequest.parse("generate", legacy.generate_body(body))
        call = await self._start(request, req, "/api/generate")
        model, call_id = _answered_by(call, req), oai.new_id("cmpl")
        if not req.stream:
            return JSONResponse(legacy.completion(await call.json(), body, model=model,
                                                  call_id=call_id), headers=call.headers())
        events = legacy.completion_events(call.lines(), body, model=model, call_id=call_id,
                                          provider=call.placement.provider)
        return _call_stream(call, events, media_type="text/event-stream")

    async def _v1_embeddings(self, request: Request) -> Response:
        body = await read_json(request, limit=self.desk.settings.max_body_bytes)
        encoding = oai.embedding_encoding(body)
        req = InferenceRequest.parse("embed", oai.embeddings_body(body))
        call = await self._start(request, req, "/api/embed")
        reply = await call.json()
        if not isinstance(reply, dict):
            raise GatewayError(502, "the provider's answer is not an object")
        return JSONResponse(oai.embeddings_reply(reply, model=_answered_by(call, req),
                                                 encoding=encoding),
                            headers=call.headers())


class _Direct:
    """The inference routes by a dictionary lookup; every other request to Starlette.

    Starlette finds a route by trying each route's pattern in turn and passes the
    request through two middlewares of its own; for the few routes that carry the load,
    whose paths are fixed, one lookup does it. Their handlers are wrapped by
    ``GatewayApp._guard``, so every error already has its answer, as under Starlette.
    The route goes into the scope as Starlette puts it there: the access log and the
    metrics name requests by it.
    """

    __slots__ = ("_app", "_routes")

    def __init__(self, app: ASGIApp, routes: Iterable[Route]) -> None:
        self._app = app
        self._routes = {(r.path, m): r for r in routes for m in r.methods or ()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (self._routes.get((scope["path"], scope["method"]))
                 if scope["type"] == "http" else None)
        if route is None:
            await self._app(scope, receive, send)
            return
        scope["route"] = route
        scope["path_params"] = {}
        handler = route.endpoint
        response = await handler(Request(scope, receive, send))
        await response(scope, receive, send)


def _answered_by(call: PlacedCall, req: InferenceRequest) -> str:
    """A reply's ``model``: the model that really answered, on every route.

    The engine's own replies (the Ollama routes) name the model it ran, so the OpenAI
    routes say the same, as OpenAI itself answers an alias with the model behind it. A
    client that asked for a ModelClass thus learns which model wrote the answer.
    """
    return call.placement.model or req.model


def _sse(value: object) -> bytes:
    return b"data: " + dumps(value) + b"\n\n"


def _call_stream(call: PlacedCall, content: AsyncIterator[bytes], *,
                 media_type: str) -> Response:
    """A streamed reply that releases its call however the response ends — including
    a client that leaves before the first byte."""

    async def release() -> None:
        await call.close(ok=None)  # a no-op when the stream already closed it

    return StreamWithCleanup(content, cleanup=release, media_type=media_type,
                             headers=call.headers())
