"""One access-log line and the per-server metrics of every request the gateway answers.

An ASGI middleware inside the guard: it sees the route that matched (Starlette puts it
in the scope), the decision headers the call's reply carries (``X-Kubemoot-Provider``,
``-Model``, ``-Action``, ``-Wait-Seconds``) and the reply's bytes as they leave. From
those alone it tells, per request:

* the route *template* (``/v1/models/{model:path}``), so metric labels stay a closed
  set whatever paths clients send;
* the time to the first byte of the body (the first token of a stream) and to the end;
* the token counts the engine reported in the reply's last object (Ollama's
  ``prompt_eval_count``/``eval_count``, OpenAI's ``usage``).

The line goes to the ``kubemoot.gateway.access`` logger at INFO (``--log-level info``);
probes and scrapes are not logged. Each inference outcome is also handed to
``on_outcome`` (the readiness check counts consecutive failures of the inference path).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubemoot import metrics
from kubemoot.gateway.guard import UNLIMITED_PATHS

__all__ = ["INFERENCE_ROUTES", "AccessLog", "Outcome", "route_template"]

log = logging.getLogger("kubemoot.gateway.access")

#: the end of a reply is where the engines put their counts
_TAIL_BYTES = 4096
#: Each token count's keys, quoted as they are in a reply (Ollama's, OpenAI's): the
#: count is the last ``"key" : digits`` of either key in the reply's tail.
_COUNTS = {
    "prompt": (b'"prompt_eval_count"', b'"prompt_tokens"'),
    "completion": (b'"eval_count"', b'"completion_tokens"'),
}

#: The decision headers' common start, and its length.
_PREFIX = b"x-kubemoot-"
_PREFIX_LENGTH = len(_PREFIX)

Outcome = Callable[[int], None]
"""``on_outcome(status)``: an inference call ended with this HTTP status."""

#: The routes whose answers say whether the inference path works.
INFERENCE_ROUTES = frozenset({"/api/chat", "/api/generate", "/api/embed", "/api/embeddings",
                              "/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


def route_template(scope: Scope) -> str:
    """The path template of the route that matched, or ``unmatched``."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) and path else "unmatched"


class AccessLog:
    """The middleware (``clock`` is a monotonic seconds function, for tests)."""

    def __init__(self, app: ASGIApp, *, on_outcome: Outcome | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.on_outcome = on_outcome
        self.clock = clock
        # Each metric's child per label values, looked up once: prometheus_client takes
        # a lock and builds a key on every ``labels`` call. The labels are a closed set
        # (route templates, statuses, providers), so these stay small.
        self._children: dict[tuple[object, ...], Any] = {}
        self._calls: dict[tuple[str, str, str], tuple[Any, ...]] = {}

    def _child(self, metric: Any, *values: str) -> Any:
        key = (metric, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = self.clock()
        status = 0
        # the decision headers by their names' ends in lower case, as bytes: the
        # provider is decoded for every call's metrics, the rest only for a log line
        decision: dict[bytes, bytes] = {}
        first: float | None = None
        tail = b""

        async def watched(message: Message) -> None:
            nonlocal status, first, tail
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for key, value in message.get("headers", ()):
                    # judged as bytes (a name in lower case, as the gateway writes
                    # them, is compared as it is)
                    if key[:_PREFIX_LENGTH] == _PREFIX or (
                            not key.islower() and key[:_PREFIX_LENGTH].lower() == _PREFIX):
                        decision[key[_PREFIX_LENGTH:].lower()] = value
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if body:
                    if first is None:
                        first = self.clock() - began
                    tail = (tail + body)[-_TAIL_BYTES:]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            self._count(scope, status or 500, decision, first, self.clock() - began, tail)

    def _adder(self, metric: Any, *values: str) -> Callable[[float], None]:
        """The ``inc`` of a counter child's value, looked up once (see :func:`_adder`)."""
        key = (_ADDER, metric, *values)
        adder = self._children.get(key)
        if adder is None:
            adder = self._children[key] = _adder(self._child(metric, *values))
        return adder  # type: ignore[no-any-return]  # an adder, as stored just above

    def _call_children(self, provider: str, route: str, code: str) -> tuple[Any, ...]:
        """A call's metric children, looked up together: the calls counter, the two
        timings, and the token counter for each kind (counters as their adders)."""
        key = (provider, route, code)
        children = self._calls.get(key)
        if children is None:
            children = self._calls[key] = (
                self._adder(metrics.GATEWAY_CALLS, provider, route, code),
                self._child(metrics.GATEWAY_CALL_SECONDS, provider),
                self._child(metrics.GATEWAY_FIRST_BYTE_SECONDS, provider),
                {kind: self._adder(metrics.GATEWAY_TOKENS, provider, kind)
                 for kind in _COUNTS})
        return children

    def _count(self, scope: Scope, status: int, decision: dict[bytes, bytes],
               first: float | None, total: float, tail: bytes) -> None:
        route = route_template(scope)
        code = str(status)
        self._adder(metrics.GATEWAY_REQUESTS, route, code)(1)
        told = decision.get(b"provider")
        provider = told.decode("latin-1") if told is not None else ""
        tokens: dict[str, int] = {}
        if provider:
            for kind, keys in _COUNTS.items():
                count = _last_count(tail, keys)
                if count is not None:
                    tokens[kind] = count
        if provider:
            calls, seconds, first_byte, counts = self._call_children(provider, route, code)
            calls(1)
            seconds.observe(total)
            if first is not None:
                first_byte.observe(first)
            for kind, count in tokens.items():
                counts[kind](count)
        if self.on_outcome is not None and route in INFERENCE_ROUTES:
            self.on_outcome(status)
        if scope["path"] in UNLIMITED_PATHS and status < 400:
            return  # probes and scrapes come every few seconds: not worth a line each
        if not log.isEnabledFor(logging.INFO):
            return  # nobody reads the line: not worth building
        client = scope.get("client")
        caller = (scope.get("state") or {}).get("caller", "-")
        words = [f'{client[0] if client else "-"} {caller} {scope["method"]} '
                 f'{str(scope["path"])[:200]} {status} {total:.3f}s']
        if provider:
            said = {k.decode("latin-1"): v.decode("latin-1") for k, v in decision.items()}
            words.append(f'provider={provider} model={said.get("model", "")} '
                         f'action={said.get("action", "")} '
                         f'wait={said.get("wait-seconds", "")}s')
            if first is not None:
                words.append(f"first_byte={first:.3f}s")
            if tokens:
                words.append(f'tokens={tokens.get("prompt", "?")}+'
                             f'{tokens.get("completion", "?")}')
        log.info(" ".join(words))


_ADDER = object()  # marks an adder's key among the children's


def _adder(child: Any) -> Callable[[float], None]:
    """A counter child's way to add: its value's own ``inc``. ``Counter.inc`` checks on
    every call that the child is labelled and the amount not negative (here it is 1, or
    a count parsed from digits), then calls that: four Python calls per count instead
    of one. The child's own ``inc`` where a prometheus_client keeps its value otherwise;
    either way the registry holds the count at once, for every reader."""
    inc = getattr(getattr(child, "_value", None), "inc", None)
    return inc if callable(inc) else cast("Callable[[float], None]", child.inc)


#: What follows a count's key: matched where the key ends, never searched for.
_VALUE = re.compile(rb"\s*:\s*(\d+)")


def _last_count(tail: bytes, keys: tuple[bytes, ...]) -> int | None:
    """The digits after the last ``"key" : `` of any of ``keys`` in ``tail`` (spaces
    allowed around the colon), or None.

    Each key is found from the end with ``bytes.rfind`` (C), and what follows it is
    matched there: the keys come once each near the end of a reply, where a regular
    expression searched the whole tail, at every position, for each kind (the counts
    of every call pass here).
    """
    best_at, best = -1, None
    for key in keys:
        end = len(tail)
        while (at := tail.rfind(key, 0, end)) > best_at:
            found = _VALUE.match(tail, at + len(key))
            if found is not None:
                best_at, best = at, int(found.group(1))
                break
            end = at + len(key) - 1  # an earlier one, or one overlapping this one
    return best
