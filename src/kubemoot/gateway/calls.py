"""One gateway call: placed by the production runtime, forwarded, released.

:meth:`CallDesk.place` asks the capacity waiter (the agent runtime's own, built by
:func:`~kubemoot.agent.wiring.build_stack`) for a ticket, waiting at most the call's
budget or until the client leaves; a refusal becomes a :class:`GatewayError` with the
status DESIGN §9 gives it. :class:`PlacedCall` then forwards the request to the chosen
provider and releases the ticket exactly once — when the reply ends, fails, or the
client disconnects (closing the upstream response cancels the engine's request too).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from kubemoot import metrics
from kubemoot.agent.runtime import CallRecord
from kubemoot.agent.wiring import RuntimeStack
from kubemoot.clock import Clock
from kubemoot.gateway.catalogue import largest_context, unknown_model
from kubemoot.gateway.errors import GatewayError
from kubemoot.gateway.requests import InferenceRequest
from kubemoot.runtime import options
from kubemoot.runtime.placement import Action, Candidate, Placement
from kubemoot.runtime.refusals import Reason
from kubemoot.runtime.settings import GatewaySettings
from kubemoot.store.protocol import StoreError

__all__ = ["AfterLoad", "CallDesk", "PlacedCall", "RefusedBeforeSending"]

log = logging.getLogger(__name__)

AfterLoad = Callable[[str], Awaitable[None]]
"""``after_load(provider)``: re-probe a provider whose memory a call changed."""

# Actions after which the provider holds a copy the published state does not show yet.
_CHANGES_MEMORY = frozenset({Action.COLD_LOAD, Action.UNLOAD, Action.LOADING})


class _WaitEnds:
    """The waiter's signals for one call: when the call joins a line (it queues), a
    task starts that ends the wait at the budget or when the client leaves. A call
    placed at once — the common case — starts no task at all."""

    def __init__(self, clock: Clock, budget: float, left: asyncio.Event) -> None:
        self._clock = clock
        self._budget = budget
        self._left = left
        self.done = asyncio.Event()
        self.joined = False
        self._task: asyncio.Future[None] | None = None

    async def waiting(self, *, model: str, reason: str) -> None:
        self.joined = True
        self._task = asyncio.ensure_future(self._end())

    async def evaluating(self, *, model: str, provider: str) -> None:
        return None

    async def _end(self) -> None:
        gone = asyncio.ensure_future(self._left.wait())
        spent = asyncio.ensure_future(self._clock.sleep(self._budget))
        try:
            await asyncio.wait({gone, spent}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            spent.cancel()
        self.done.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class RefusedBeforeSending(GatewayError):
    """The placed provider refused the connection before any byte of the request left.

    The call's ticket is back and the provider's circuit has counted the fault; the
    caller may place the call once more with ``provider`` excluded (DESIGN §5). Left
    uncaught it is the 502 it would have been anyway.
    """

    def __init__(self, provider: str, message: str) -> None:
        super().__init__(502, message, code="provider_error")
        self.provider = provider


@dataclass(slots=True)
class CallDesk:
    """Places, forwards and releases gateway calls over one runtime stack."""

    stack: RuntimeStack
    http: httpx.AsyncClient
    settings: GatewaySettings
    after_load: AfterLoad | None = None
    listeners: list[Callable[[CallRecord], None]] = field(default_factory=list)
    # provider → models pinned there: a call to a pinned copy keeps it loaded
    pinned: Mapping[str, Sequence[str]] = field(default_factory=dict)
    _serial: itertools.count[int] = field(default_factory=itertools.count)
    in_flight: set[PlacedCall] = field(default_factory=set)

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

    async def place(
        self,
        request: InferenceRequest,
        candidates: Sequence[Candidate],
        *,
        caller: str,
        budget: float,
        left: asyncio.Event,
        exclude: Sequence[str] = (),
    ) -> PlacedCall:
        """A call holding a ticket, or a :class:`GatewayError` saying why not.

        A busy call waits until the budget is spent or ``left`` is set (the client
        went away); either ends the wait the waiter's own way, so a ticket granted at
        that moment is never lost. ``exclude``: providers this call must not go to.
        """
        clock = self.stack.clock
        started = clock.now()
        estimator = self.stack.agents.estimator(candidates[0].model)
        prompt_tokens = (estimator.estimate_prompt(request.messages, request.tools)
                         if request.messages else None)
        if (prompt_tokens is not None and request.num_ctx is not None
                and prompt_tokens > request.num_ctx):
            raise _prompt_too_large(prompt_tokens, request.num_ctx, "options.num_ctx")
        holder = f"gateway:{caller}#{next(self._serial)}"
        signals = _WaitEnds(clock, budget, left)
        if left.is_set() or budget <= 0:
            signals.done.set()  # nothing to wait for: a busy answer is final at once
        try:
            placement = await self.stack.agents.waiter.place(
                candidates, agent=caller, holder_id=holder, prompt_tokens=prompt_tokens,
                signals=signals, done=signals.done, exclude=exclude,
            )
        finally:
            await signals.close()
        if left.is_set():
            if placement.placed:
                await self.stack.planner.release(placement)
            raise GatewayError(499, "the client went away while its call waited")
        if not placement.placed:
            raise await self._refusal(placement, candidates, prompt_tokens, budget,
                                      num_ctx=request.num_ctx, asked=request.model)
        action = placement.action.value
        if signals.joined and placement.action in (Action.WARM, Action.LOADING):
            action = Action.QUEUE.value  # it waited in line for a slot of a warm copy
        call = PlacedCall(self, request, placement, caller=caller, holder=holder,
                          started=started, prompt_tokens=prompt_tokens, action=action)
        self.in_flight.add(call)
        try:
            # renewed every TTL/3 while the reply lasts, so a long answer keeps its memory
            await call.lease.enter_async_context(self.stack.planner.lease(placement))
        except BaseException:
            await call.close(ok=None)
            raise
        return call

    async def _refusal(self, placement: Placement, candidates: Sequence[Candidate],
                       prompt_tokens: int | None, budget: float, *,
                       asked: str, num_ctx: int | None = None) -> GatewayError:
        model = candidates[0].model
        name = _as_asked(asked, candidates)
        if placement.reason == Reason.MODEL_UNKNOWN.value:
            return unknown_model(model)
        if placement.reason == Reason.MODEL_TOO_LARGE.value:
            return await self._too_large(model, name)
        if placement.reason == Reason.PROMPT_TOO_LARGE.value:
            fleet = await self.stack.view.snapshot()
            largest = largest_context(fleet, [c.model for c in candidates])
            error = _prompt_too_large(prompt_tokens or 0, largest, f"model {name}")
            if num_ctx is not None and (largest is None or num_ctx > largest):
                # a copy loaded at the client's num_ctx would take a KV cache no ticket
                # sized, so the option cannot open a larger context than the fleet runs
                error.message += (f"; options.num_ctx ({num_ctx}) is not used to load a "
                                  "copy with a larger context than its provider runs")
            return error
        waited = placement.waited_seconds
        retry = await self._retry_after(candidates, prompt_tokens)
        return GatewayError(
            503, f"every GPU that can run {name} is busy; waited {waited:.1f} s of a "
            f"{budget:g} s budget (X-Kubemoot-Wait-Budget); retry in about {retry} s",
            code="gpu_busy", headers={"Retry-After": str(retry)})

    async def _too_large(self, model: str, name: str) -> GatewayError:
        """model-too-large with the sizes that prove it: the model's footprint against
        the largest usable memory (VRAM total less reserve) of any card."""
        fleet = await self.stack.view.snapshot()
        need = self.stack.planner.occupancy.occupancy(model, fleet)
        cards = [(p.usable_mib, p.name) for p in fleet.providers if p.usable_mib is not None]
        message = f"model {name} is larger than the usable memory of every GPU in the fleet"
        if need is not None and cards:
            usable, card = min(cards, key=lambda c: (-c[0], c[1]))  # ties: by name
            message += (f": it needs {need} MiB, and the largest usable memory in the "
                        f"fleet is {usable} MiB on {card} (its VRAM total less its reserve)")
        return GatewayError(400, message, code="model_too_large")

    async def _retry_after(self, candidates: Sequence[Candidate],
                           prompt_tokens: int | None) -> int:
        """Whole seconds until the call could probably start, priced afresh now.

        The wait's last options were priced at its last capacity change and may name an
        unload plan that was never claimable; what counts is when work in flight ends
        (:func:`~kubemoot.runtime.options.start_estimate`). With nothing in flight to
        go by, the next probe is the next news.
        """
        planner = self.stack.planner
        rnd = await planner.new_round(prompt_tokens)
        models = [c.model for c in planner.in_tolerance(candidates)]
        estimate = options.start_estimate(rnd, models)
        if estimate is None:
            estimate = self.settings.probe_interval_seconds
        return max(1, math.ceil(estimate))

    def record(self, call: PlacedCall, *, ok: bool) -> None:
        p = call.placement
        now = self.stack.clock.now()
        record = CallRecord(
            thread_id=call.holder, agent=call.caller, phase=call.request.kind,
            model=p.model, provider=p.provider, endpoint=p.endpoint, action=call.action,
            waited_seconds=p.waited_seconds, evicted=p.evicted, started_at=call.started,
            seconds=now - call.started, ok=ok, prompt_tokens=call.prompt_tokens,
            model_calls=1,
        )
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:  # attribution must never fail a call
                log.exception("call listener failed")


def _as_asked(asked: str, candidates: Sequence[Candidate]) -> str:
    """The model as the client named it; a ModelClass also lists what it stands for."""
    models = [c.model for c in candidates]
    if asked in models:
        return f'"{asked}"'
    return f'"{asked}" ({", ".join(models)})'


def _prompt_too_large(tokens: int, largest: int | None, where: str) -> GatewayError:
    context = f"{largest} tokens" if largest is not None else "unknown"
    return GatewayError(
        400, f"the prompt is about {tokens} tokens, more than the largest context "
        f"available for {where} ({context}); the gateway never cuts a prompt",
        code="context_length_exceeded")


class PlacedCall:
    """A placed call: forwards once, releases once."""

    def __init__(self, desk: CallDesk, request: InferenceRequest, placement: Placement, *,
                 caller: str, holder: str, started: float, prompt_tokens: int | None,
                 action: str) -> None:
        self.desk = desk
        self.request = request
        self.placement = placement
        self.caller = caller
        self.holder = holder
        self.started = started
        self.prompt_tokens = prompt_tokens
        self.action = action
        self._began = desk.stack.clock.now()
        self._upstream: httpx.Response | None = None
        self._closed = False
        self.lease = contextlib.AsyncExitStack()

    def headers(self) -> dict[str, str]:
        """The ``X-Kubemoot-*`` decision headers of the reply."""
        p = self.placement
        headers = {
            "X-Kubemoot-Provider": p.provider or "",
            "X-Kubemoot-Model": p.model or "",
            "X-Kubemoot-Action": self.action,
            "X-Kubemoot-Wait-Seconds": f"{p.waited_seconds:.3f}",
        }
        if p.evicted:
            headers["X-Kubemoot-Evicted"] = ",".join(p.evicted)
        return headers

    def upstream_body(self, *, legacy_embeddings: bool = False) -> dict[str, Any]:
        """The body the engine gets: the placed model, bounded keep-alive, no cutting."""
        req, p = self.request, self.placement
        body = dict(req.body)
        body.pop("name", None)
        body["model"] = p.model
        body["stream"] = req.stream
        if not legacy_embeddings:  # /api/embeddings has no such switch
            body["truncate"] = False  # an over-long prompt must fail, never be cut
        limit = self.desk.settings.max_keep_alive_seconds
        if p.model in self.desk.pinned.get(p.provider or "", ()):
            body["keep_alive"] = -1  # a pinned copy stays: no call's keep_alive ends it
        elif req.keep_alive is not None and req.keep_alive > limit:
            body["keep_alive"] = int(limit)
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

    async def open(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """Send the request upstream; an error status becomes a GatewayError (released)."""
        assert self.placement.endpoint is not None
        url = f"{self.placement.endpoint.rstrip('/')}{path}"
        try:
            request = self.desk.http.build_request("POST", url, json=body)
            response = await self.desk.http.send(request, stream=True)
        except httpx.ConnectError as error:
            # no connection, so not a byte of the request left: the one failure that
            # may be placed again (elsewhere); the circuit still counts it
            await self.close(ok=False)
            raise RefusedBeforeSending(
                self.placement.provider or "", f"provider {self.placement.provider} "
                f"refused the connection: {error}") from None
        except httpx.HTTPError as error:
            await self.close(ok=False)
            raise GatewayError(502, f"provider {self.placement.provider} did not answer: "
                               f"{type(error).__name__}: {error}",
                               code="provider_error") from None
        except BaseException:
            await self.close(ok=None)  # cancelled: the client went away
            raise
        self._upstream = response
        if response.status_code >= 400:
            try:
                text = (await response.aread()).decode("utf-8", "replace")
            except httpx.HTTPError:
                text = ""
            # a 4xx is the request's fault, not the provider's
            await self.close(ok=False if response.status_code >= 500 else None)
            raise _upstream_error(response.status_code, text, self)
        return response

    async def lines(self) -> AsyncIterator[bytes]:
        """The engine's NDJSON lines (newline kept); the ticket is released when they end
        or stop."""
        assert self._upstream is not None
        ok: bool | None = None  # None: the client left, which is no provider's fault
        try:
            async for line in self._upstream.aiter_lines():
                if line.strip():
                    yield line.encode("utf-8") + b"\n"
            ok = True
        except httpx.HTTPError as error:
            ok = False
            log.warning("stream from %s broke: %s", self.placement.provider, error)
            raise
        finally:
            await self.close(ok=ok)

    async def json(self) -> Any:
        """The engine's whole (non-streamed) answer as JSON; released afterwards."""
        assert self._upstream is not None
        ok: bool | None = None
        try:
            raw = await self._upstream.aread()
            value = json.loads(raw)
            ok = True
            return value
        except (httpx.HTTPError, ValueError) as error:
            ok = False
            raise GatewayError(502, f"provider {self.placement.provider} gave a broken "
                               f"answer: {type(error).__name__}",
                               code="provider_error") from None
        finally:
            await self.close(ok=ok)

    async def close(self, *, ok: bool | None) -> None:
        """Close upstream, learn, re-probe after a load, release the ticket; once.

        ``ok`` None means the client went away: the ticket is released without
        teaching the latency average or the provider's circuit anything.
        """
        if self._closed:
            return
        self._closed = True
        await asyncio.shield(self._release(ok))

    async def _release(self, ok: bool | None) -> None:
        desk, p = self.desk, self.placement
        stack = desk.stack
        try:
            await self.lease.aclose()
            if self._upstream is not None:
                await self._upstream.aclose()  # a client that left cancels the engine too
            if (p.action in _CHANGES_MEMORY and desk.after_load is not None
                    and p.provider is not None):
                try:
                    await desk.after_load(p.provider)
                except (StoreError, OSError) as error:
                    kind = metrics.STORE if isinstance(error, StoreError) else metrics.PROVIDER
                    metrics.survived("gateway", "after-load", kind, f"re-probing "
                                     f"{p.provider} after a load failed", error, logger=log)
        finally:
            try:
                if ok is None:
                    await stack.planner.release(p)
                else:
                    await stack.planner.finish(p, seconds=stack.clock.now() - self._began,
                                               ok=ok)
            except (StoreError, OSError) as error:
                # the TTL reclaims it; an answer already given is never turned into an error
                metrics.survived("gateway", "release", metrics.STORE, f"releasing the "
                                 f"ticket of {self.holder} failed; its TTL will reclaim it",
                                 error, logger=log)
            desk.in_flight.discard(self)
            if ok and p.model is not None:
                try:
                    await stack.board.record_use(p.model)
                except StoreError as error:
                    metrics.survived("gateway", "record-use", metrics.STORE,
                                     f"recording the use of {p.model} failed", error,
                                     logger=log)
            desk.record(self, ok=bool(ok))


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
