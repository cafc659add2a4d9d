"""One gateway call: its lifecycle is the runtime's, its forwarding is the gateway's.

:meth:`CallDesk.start` hands the call to the runtime's
:class:`~kubemoot.runtime.calls.CallService` — placed with the call's wait budget (or
until the client leaves), leased, retried once elsewhere after a refused connection,
released and recorded — and supplies what is the gateway's: a :class:`PlacedCall` that
forwards the request to the chosen provider, streams the reply and closes the upstream
response, once, when the reply ends, fails, or the client disconnects (closing it
cancels the engine's request too). A refusal becomes an answer in
:func:`~kubemoot.gateway.errors.refusal_error`, the one place that translates it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubemoot.gateway import jsoncodec
from kubemoot.gateway.errors import GatewayError, as_asked, prompt_too_large, refusal_error
from kubemoot.gateway.requests import InferenceRequest
from kubemoot.gateway.upstream import ConnectFailed, Upstream, UpstreamError, UpstreamResponse
from kubemoot.runtime.builder import Runtime
from kubemoot.runtime.calls import (
    ActiveCall,
    CallAbandoned,
    CallRefused,
    CallRequest,
    CallService,
    RefusedBeforeSending,
)
from kubemoot.runtime.placement import Action, CandidateModel
from kubemoot.runtime.refusals import GpuBusy
from kubemoot.settings import GatewaySettings

__all__ = ["CallDesk", "CallEnds", "PlacedCall", "error_line", "shutting_down"]

log = logging.getLogger(__name__)


class CallEnds:
    """What ends a gateway call early: its client leaving, or the gateway draining.

    Told by callbacks rather than by a task waiting on each event: every task a call
    starts is loop work the gateway pays on each request.
    """

    __slots__ = ("_on_left", "ended", "left")

    def __init__(self) -> None:
        #: The client went away.
        self.left = False
        #: The call's wait for capacity ends: the client left, or the gateway drains.
        self.ended = asyncio.Event()
        self._on_left: list[Callable[[], object]] = []

    def client_left(self) -> None:
        if self.left:
            return
        self.left = True
        self.ended.set()
        for callback in list(self._on_left):
            callback()

    def on_left(self, callback: Callable[[], object]) -> None:
        self._on_left.append(callback)

    def forget(self, callback: Callable[[], object]) -> None:
        if callback in self._on_left:  # no context manager: this runs on every call
            self._on_left.remove(callback)


@dataclass(slots=True)
class CallDesk:
    """Starts and forwards gateway calls over one runtime."""

    runtime: Runtime
    http: Upstream
    settings: GatewaySettings
    # provider → models pinned there: a call to a pinned copy keeps it loaded
    pinned: Mapping[str, Sequence[str]] = field(default_factory=dict)
    in_flight: set[PlacedCall] = field(default_factory=set)
    #: Set once the gateway begins to shut down (:meth:`drain`): no call is placed or
    #: sent after it.
    draining: asyncio.Event = field(default_factory=asyncio.Event)
    #: The calls being placed or sent: a drain ends their waits.
    _waiting: set[CallEnds] = field(default_factory=set)

    @property
    def calls(self) -> CallService:
        return self.runtime.calls

    def budget(self, header: str | None) -> float:
        """The wait budget: the client's ``X-Kubemoot-Wait-Budget`` or ``--wait-limit``."""
        if header is None or not header.strip():
            return self.settings.wait_limit_seconds
        try:
            value = float(header)
        except ValueError:
            raise GatewayError(400, f"X-Kubemoot-Wait-Budget must be a number of seconds, "
                               f"got {header[:40]!r}") from None
        if not math.isfinite(value) or value < 0:
            raise GatewayError(400, "X-Kubemoot-Wait-Budget must be a non-negative number")
        return min(value, self.settings.max_wait_budget_seconds)

    def keep_alive(self, asked: float | None) -> float | int:
        """The ``keep_alive`` the engine is sent for a client that asked ``asked``.

        Residency is a lease the scheduler must see end (DESIGN §5): a copy the engine
        drops between two probes is still shown resident, so the next call would be
        placed on it warm and reload it with memory no ticket holds. So a short
        keep-alive is raised to the freshness window (probe interval + state cache), and
        none at all asks for the runtime's ``engine_keep_alive_seconds`` — as the
        simulator's calls do — since the scheduler's own unloads make room. A negative
        one (forever) and a long one are bounded by ``--max-keep-alive``. (``keep_alive: 0``
        with no prompt is the client's unload, answered before any call is placed.)
        """
        limit = self.settings.max_keep_alive_seconds
        if asked is None:
            return _whole(min(self.runtime.settings.engine_keep_alive_seconds, limit))
        fresh = self.settings.provider_probe_seconds + self.runtime.settings.state_cache_seconds
        if asked < 0 or asked > limit:
            return _whole(limit)
        # 0 (unload after this call) is short too: the copy would vanish unseen
        return _whole(max(asked, fresh))

    def request(self, req: InferenceRequest, candidates: Sequence[CandidateModel], *,
                caller: str, budget: float, left: asyncio.Event) -> CallRequest:
        """The runtime's view of one HTTP call (its prompt estimated, its own checks)."""
        calls = self.runtime.calls  # not through the property: every call passes here
        prompt_tokens = (calls.estimate(candidates[0].model, req.messages, req.tools)
                         if req.messages else None)
        if (prompt_tokens is not None and req.num_ctx is not None
                and prompt_tokens > req.num_ctx):
            raise prompt_too_large(prompt_tokens, req.num_ctx, "options.num_ctx")
        thread = calls.thread_id(f"gateway:{caller}")  # names this replica
        return CallRequest(
            tuple(candidates), agent=caller, thread_id=thread, phase=req.kind,
            prompt_tokens=prompt_tokens, budget=budget, done=left, abandon_when_done=True,
            holder=thread)

    def drain(self) -> None:
        """Place and send no more calls; end the waits of those still waiting (503)."""
        self.draining.set()
        for ends in list(self._waiting):
            ends.ended.set()

    async def start(self, req: InferenceRequest, candidates: Sequence[CandidateModel], *,
                    caller: str, budget: float, ends: CallEnds, path: str,
                    legacy_embeddings: bool = False) -> PlacedCall:
        """Place the call and open its upstream request, while watching the client.

        A client that leaves while its call waits ends the wait; one that leaves while
        the engine has not answered yet cancels the upstream request (and the ticket
        goes back). Refusals become their HTTP answers here.
        """
        if self.draining.is_set():
            raise shutting_down()
        # The wait ends when the client leaves or the gateway begins to shut down.
        request = self.request(req, candidates, caller=caller, budget=budget,
                               left=ends.ended)

        async def send(active: ActiveCall) -> PlacedCall:
            if self.draining.is_set():  # placed as the drain began: never sent
                raise shutting_down()
            call = PlacedCall(self, req, active)
            self.in_flight.add(call)
            try:
                await call.open_watching(path, call.upstream_body(
                    legacy_embeddings=legacy_embeddings), ends)
            except BaseException:
                await call.close_upstream()
                self.in_flight.discard(call)
                raise
            return call

        self._waiting.add(ends)
        try:
            _active, call = await self.runtime.calls.start(request, send)
        except CallAbandoned:
            if self.draining.is_set() and not ends.left:
                raise shutting_down() from None
            raise GatewayError(499, "the client went away while its call waited") from None
        except CallRefused as refused:
            raise self._refusal(refused, req, candidates, budget) from None
        except RefusedBeforeSending as refused:  # the second refusal is the answer
            raise GatewayError(502, refused.message, code="provider_error") from None
        finally:
            self._waiting.discard(ends)
        return call

    def _refusal(self, refused: CallRefused, req: InferenceRequest,
                 candidates: Sequence[CandidateModel], budget: float) -> GatewayError:
        refusal = refused.refusal
        retry = (self.calls.retry_after(refusal) if isinstance(refusal, GpuBusy)
                 else max(1, math.ceil(self.settings.provider_probe_seconds)))
        name = as_asked(req.model, [c.model for c in candidates])
        return refusal_error(refusal, name=name, budget=budget, retry_after=retry,
                             num_ctx=req.num_ctx)


class PlacedCall:
    """A placed call's forwarding: opens upstream once, closes it and the call once."""

    def __init__(self, desk: CallDesk, request: InferenceRequest, active: ActiveCall) -> None:
        self.desk = desk
        self.request = request
        self.active = active
        self.placement = active.placement
        self._upstream: UpstreamResponse | None = None
        self._closed = False

    @property
    def prompt_tokens(self) -> int | None:
        return self.active.prompt_tokens

    def headers(self) -> dict[str, str]:
        """The ``X-Kubemoot-*`` decision headers of the reply."""
        p, active = self.placement, self.active
        headers = {
            "X-Kubemoot-Provider": p.provider or "",
            "X-Kubemoot-Model": p.model or "",
            "X-Kubemoot-Action": active.action,
            # arrival → start of inference, a load included (DESIGN §9)
            "X-Kubemoot-Wait-Seconds": f"{active.waited_seconds:.3f}",
            "X-Kubemoot-Placement-Seconds": f"{active.placement_seconds:.3f}",
        }
        if p.evicted:
            headers["X-Kubemoot-Evicted"] = ",".join(p.evicted)
        return headers

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """:meth:`headers` as they go on the wire (lower-case names, Latin-1 bytes)."""
        p, active = self.placement, self.active
        raw = [(b"x-kubemoot-provider", (p.provider or "").encode("latin-1")),
               (b"x-kubemoot-model", (p.model or "").encode("latin-1")),
               (b"x-kubemoot-action", active.action.encode("latin-1")),
               (b"x-kubemoot-wait-seconds", b"%.3f" % active.waited_seconds),
               (b"x-kubemoot-placement-seconds", b"%.3f" % active.placement_seconds)]
        if p.evicted:
            raw.append((b"x-kubemoot-evicted", ",".join(p.evicted).encode("latin-1")))
        return raw

    def upstream_body(self, *, legacy_embeddings: bool = False) -> dict[str, Any]:
        """The body the engine gets: the placed model, bounded keep-alive, no cutting."""
        req, p = self.request, self.placement
        body = dict(req.body)
        body.pop("name", None)
        body["model"] = p.model
        body["stream"] = req.stream
        if not legacy_embeddings:  # /api/embeddings has no such switch
            body["truncate"] = False  # an over-long prompt must fail, never be cut
        if p.model in self.desk.pinned.get(p.provider or "", ()):
            body["keep_alive"] = -1  # a pinned copy stays: no call's keep_alive ends it
        else:
            body["keep_alive"] = self.desk.keep_alive(req.keep_alive)
        if req.num_ctx is not None and not self._num_ctx_is_budgeted():
            options = dict(body.get("options") or {})
            options.pop("num_ctx", None)
            body["options"] = options
        return body

    def _num_ctx_is_budgeted(self) -> bool:
        """May the client's ``num_ctx`` reach the engine unchanged?

        The engine (re)loads a copy at the ``num_ctx`` it is sent, and the KV cache it
        reserves grows with it, so any other value than the one the ticket was sized
        at would reload a warm copy, or load a cold one, with memory no ticket holds.
        The ticket sized the copy at the context the runtime placed on (the loaded one
        for a warm or loading copy, the provider's own for a load), so only that value
        passes. Dropping any other is safe: the runtime placed the call only where
        that context holds the prompt (an unknown context leaves the engine to refuse
        an over-long prompt, never to cut it). A static placement budgets nothing.
        """
        p = self.placement
        if p.action is Action.STATIC:
            return True
        return p.context_length is not None and p.context_length == self.request.num_ctx

    async def open_watching(self, path: str, body: dict[str, Any], ends: CallEnds) -> None:
        """:meth:`open`, given up (499) when the client leaves before the engine answers.

        The client's leaving cancels this very task (no task of its own to watch it);
        a cancellation that came from elsewhere as well (the server's shutdown) goes on.
        """
        task = asyncio.current_task(self.active.service.loop())
        assert task is not None
        if ends.left:
            raise GatewayError(499, "the client went away before the engine answered")
        ends.on_left(task.cancel)
        try:
            await self.open(path, body)
        except asyncio.CancelledError:
            if ends.left and task.uncancel() == 0:
                raise GatewayError(499, "the client went away before the engine "
                                   "answered") from None
            raise
        finally:
            ends.forget(task.cancel)

    async def open(self, path: str, body: dict[str, Any]) -> UpstreamResponse:
        """Send the request upstream; an error status becomes a GatewayError."""
        assert self.placement.endpoint is not None
        url = f"{self.placement.endpoint.rstrip('/')}{path}"
        provider = self.placement.provider or ""
        try:
            response = await self.desk.http.post(url, jsoncodec.dumps(body))
        except ConnectFailed as error:
            # no connection, so not a byte of the request left: the one failure that
            # may be placed again (elsewhere); the circuit still counts it
            raise RefusedBeforeSending(
                provider, f"provider {provider} refused the connection: {error}") from None
        except UpstreamError as error:
            self.active.note(ok=False)
            raise GatewayError(502, f"provider {provider} did not answer: "
                               f"{type(error).__name__}: {error}",
                               code="provider_error") from None
        self._upstream = response
        self.active.note(model_calls=1)
        if response.status >= 400:
            try:
                text = (await response.read()).decode("utf-8", "replace")
            except UpstreamError:
                text = ""
            if response.status >= 500:  # a 4xx is the request's fault, not the provider's
                self.active.note(ok=False)
            raise _upstream_error(response.status, text, self)
        if self.request.stream:
            self.active.first_byte()  # the first chunk came with the headers
        return response

    async def lines(self) -> AsyncIterator[bytes]:
        """The engine's NDJSON lines (newline kept), as it sent them; the call is closed
        when they end or stop."""
        assert self._upstream is not None
        ok: bool | None = None  # None: the client left, which is no provider's fault
        try:
            async for line in self._upstream.lines():
                yield line
            ok = True
        except UpstreamError as error:
            # The client already has 200 and part of the answer: the last line must say
            # the answer is incomplete (DESIGN §9), never end as if it were whole.
            ok = False
            provider = self.placement.provider
            log.warning("stream from %s broke: %s", provider, error)
            yield error_line(f"the stream from provider {provider} broke before the "
                             f"answer was complete: {type(error).__name__}")
        finally:
            await self.close(ok=ok)

    async def json(self) -> Any:
        """The engine's whole (non-streamed) answer as JSON; closed afterwards."""
        return (await self.answer())[0]

    async def answer(self) -> tuple[Any, bytes]:
        """The engine's whole (non-streamed) answer, parsed and as it came; closed
        afterwards."""
        assert self._upstream is not None
        ok: bool | None = None
        try:
            raw = await self._upstream.read()
            value = jsoncodec.loads(raw)
            ok = True
            # the answer came whole: inference began its own time before its arrival
            self.active.first_byte(at=self.active.service.clock.now() - _compute_seconds(value))
            return value, raw
        except (UpstreamError, ValueError) as error:
            ok = False
            raise GatewayError(502, f"provider {self.placement.provider} gave a broken "
                               f"answer: {type(error).__name__}",
                               code="provider_error") from None
        finally:
            await self.close(ok=ok)

    async def close_upstream(self) -> None:
        self._close_upstream()

    def _close_upstream(self) -> None:
        if self._upstream is not None:
            self._upstream.close()  # a client that left cancels the engine too

    async def close(self, *, ok: bool | None) -> None:
        """Close upstream, then the call (learn, re-probe, release, record); once.

        ``ok`` None means the client went away: the ticket is released without
        teaching the latency average or the provider's circuit anything.
        """
        if self._closed:
            return
        self._closed = True
        try:
            # Not awaited: closing the answer never waits, so no cancellation can stop
            # it half-way (a shield would cost a task per call for nothing).
            self._close_upstream()
        finally:
            self.desk.in_flight.discard(self)
            await self.active.close(ok=ok)


_JSON_BODY = {"Content-Type": "application/json"}


def shutting_down() -> GatewayError:
    """The answer to a call the gateway will not place because it is shutting down."""
    return GatewayError(503, "the gateway is shutting down; retry the call",
                        code="shutdown", headers={"Retry-After": "1"})


def error_line(message: str) -> bytes:
    """A stream's final NDJSON line saying why it ends early (Ollama's error shape)."""
    return jsoncodec.dumps({"error": message}) + b"\n"


def _whole(seconds: float) -> float | int:
    """Seconds as the engine's ``keep_alive``: whole when they are (Ollama's integer
    form), else rounded up to the millisecond (never below what was meant)."""
    if float(seconds).is_integer():
        return int(seconds)
    return math.ceil(seconds * 1000) / 1000


def _compute_seconds(reply: object) -> float:
    """The engine's time on a reply after its load (Ollama's nanosecond durations)."""
    if type(reply) is not dict:  # a parsed answer: exactly a dict, an int or a float
        return 0.0
    total, load = reply.get("total_duration"), reply.get("load_duration")
    # compared by type, not isinstance: true and false are ints to isinstance
    if type(total) is not int and type(total) is not float:
        return 0.0
    if type(load) is not int and type(load) is not float:
        load = 0
    return max(0.0, (total - load) / 1e9)


def _context_facts(call: PlacedCall) -> str:
    """What the gateway knew when the engine refused a prompt as too long."""
    p = call.placement
    estimate = ("no estimate of the prompt" if call.prompt_tokens is None
                else f"estimated prompt: {call.prompt_tokens} tokens")
    if p.context_length is not None:
        return f"{estimate}; context of {p.model} on {p.provider}: {p.context_length} tokens"
    # Nothing told the gateway this context: a cold load on a provider given without one.
    return (f"{estimate}; provider {p.provider} has no known context length: give "
            "contextLength in --provider or in its ModelProvider")


def _upstream_error(status: int, text: str, call: PlacedCall) -> GatewayError:
    try:
        said = json.loads(text).get("error")
    except (ValueError, AttributeError):
        said = None
    message = str(said) if said else (text.strip()[:200] or f"HTTP {status}")
    provider = call.placement.provider
    if status == 404:
        return GatewayError(404, message, code="model_not_found")
    lowered = message.lower()
    if status == 400 and any(w in lowered for w in ("context", "too long", "truncat")):
        return GatewayError(400, f"{message} ({_context_facts(call)})",
                            code="context_length_exceeded")
    if status >= 500:
        return GatewayError(502, f"provider {provider} failed: {message}",
                            code="provider_error")
    return GatewayError(status, message)

