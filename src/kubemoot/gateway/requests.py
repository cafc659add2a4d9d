"""Reading a client's request: the body, the model name, the prompt, engine options.

Everything here is pure and raises :class:`GatewayError` (400/413) with a message that
names the field, so bad input never reaches the planner or an engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from kubemoot.gateway import jsoncodec
from kubemoot.gateway.errors import GatewayError
from kubemoot.providers.durations import DurationError, duration_seconds

__all__ = [
    "InferenceRequest",
    "bool_field",
    "embed_inputs",
    "header",
    "keep_alive_seconds",
    "model_name",
    "read_json",
]


def header(request: Request, name: bytes) -> str | None:
    """The request's first ``name`` header (``name`` in lower case, as ASGI gives header
    names), decoded as Latin-1: what ``request.headers.get`` says, read from the scope.

    Starlette builds a ``Headers`` for each request, and its ``get`` of a header that is
    not there raises and catches a ``KeyError``; the inference routes read two or three
    headers on every call (the body's length, the wait budget, the key).
    """
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


async def read_json(request: Request, *, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past ``limit`` bytes, 400 when not an object."""
    declared = header(request, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    # The messages are read here rather than through Starlette's ``stream()``, an async
    # generator that costs each request several more steps for the one message a body
    # usually comes in.
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            # the client left mid-body: nobody to answer, and nothing went wrong here
            raise GatewayError(499, "the client went away while sending its body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if not raw.strip():
        raise GatewayError(400, "the request needs a JSON body")
    try:
        body = jsoncodec.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        raise GatewayError(400, f"invalid JSON body: {_short(error)}") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the body must be a JSON object")
    return body


def _no_constant(name: str) -> object:
    """Python's JSON reader accepts NaN and Infinity; JSON does not, and neither will the
    engine's: refused here, before the call is placed, not after a ticket was claimed."""
    raise ValueError(f"{name} is not a JSON number")


def _too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"the request body is larger than {limit} bytes")


def _short(error: BaseException) -> str:
    text = str(error)
    return text if len(text) <= 120 else text[:117] + "…"


def model_name(body: Mapping[str, Any]) -> str:
    """``model`` (Ollama also accepts ``name``) as a non-empty string."""
    name = body.get("model", body.get("name"))
    if name is None or name == "":
        raise GatewayError(400, "model is required", code="model_required")
    if not isinstance(name, str):
        raise GatewayError(400, f"model must be a string, got {type(name).__name__}")
    return name.strip()


def bool_field(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise GatewayError(400, f"{name} must be true or false, got {json.dumps(value)[:40]}")
    return value


def _object_field(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GatewayError(400, f"{name} must be an object")
    return value


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise GatewayError(400, "messages must be a list of objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise GatewayError(400, f"messages[{index}] must be an object")
        if not isinstance(message.get("role", "user"), str):
            raise GatewayError(400, f"messages[{index}].role must be a string")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise GatewayError(400, f"messages[{index}].content must be a string")
        _tool_calls(message.get("tool_calls"), f"messages[{index}].tool_calls")
    return messages


def _tool_calls(calls: object, where: str) -> None:
    """Ollama's ``tool_calls``: a list of ``{"function": {"name", "arguments"}}``.

    Checked at the edge because the prompt estimate reads them before placing the call.
    """
    if calls is None:
        return
    if not isinstance(calls, list):
        raise GatewayError(400, f"{where} must be a list of objects")
    for index, call in enumerate(calls):
        here = f"{where}[{index}]"
        if not isinstance(call, dict):
            raise GatewayError(400, f"{here} must be an object")
        function = call.get("function")
        if not isinstance(function, dict):
            raise GatewayError(400, f"{here}.function must be an object")
        if not isinstance(function.get("name"), str):
            raise GatewayError(400, f"{here}.function.name must be a string")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, dict | str):
            raise GatewayError(400, f"{here}.function.arguments must be an object")


def _prompt_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``/api/generate``'s prompt (and system) as chat messages, for the estimate."""
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise GatewayError(400, "prompt must be a string")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise GatewayError(400, "system must be a string")
    suffix = body.get("suffix")  # fill-in-the-middle: the engine's prompt holds it too
    if suffix is not None and not isinstance(suffix, str):
        raise GatewayError(400, "suffix must be a string")
    if not prompt:
        return []
    head = [{"role": "system", "content": system}] if system else []
    tail = [{"role": "user", "content": suffix}] if suffix else []
    return [*head, {"role": "user", "content": prompt}, *tail]


def keep_alive_seconds(value: object) -> float | None:
    """Ollama's ``keep_alive`` in seconds (negative: forever); a bad one is a 400."""
    if value is None:
        return None
    try:
        return duration_seconds(value)
    except DurationError as error:
        raise GatewayError(400, str(error)) from None


def embed_inputs(body: Mapping[str, Any], field: str) -> list[str]:
    """``input`` of /api/embed (a string or a list of strings), or ``prompt``."""
    value = body.get(field)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    if value is None:
        return []
    raise GatewayError(400, f"{field} must be a string or a list of strings")


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One inference request as the gateway places it (Ollama's shape)."""

    kind: str  # chat | generate | embed
    model: str  # as the client named it
    body: dict[str, Any]  # the Ollama body to forward (model replaced at placement)
    messages: Sequence[Mapping[str, Any]]  # what the prompt estimate counts
    tools: Sequence[Mapping[str, Any]]
    stream: bool
    num_ctx: int | None
    keep_alive: float | None

    @property
    def is_load_request(self) -> bool:
        """No prompt at all: Ollama's preload (or with ``keep_alive: 0``, unload)."""
        return self.kind != "embed" and not self.messages

    @classmethod
    def parse(cls, kind: str, body: dict[str, Any]) -> InferenceRequest:
        model = model_name(body)
        options = _object_field(body, "options")
        num_ctx = options.get("num_ctx")
        if num_ctx is not None and (isinstance(num_ctx, bool) or not isinstance(num_ctx, int)
                                    or num_ctx <= 0):
            raise GatewayError(400, "options.num_ctx must be a positive integer")
        tools = body.get("tools") or []
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise GatewayError(400, "tools must be a list of objects")
        if kind == "chat":
            messages = _messages(body)
        elif kind == "generate":
            messages = _prompt_messages(body)
        else:
            field = "input" if "input" in body else "prompt"
            messages = [{"role": "user", "content": text}
                        for text in embed_inputs(body, field)]
            if not messages:
                raise GatewayError(400, "input is required")
        stream = bool_field(body, "stream", kind != "embed")
        keep_alive = keep_alive_seconds(body.get("keep_alive"))
        return cls(kind, model, body, messages, tools, stream, num_ctx, keep_alive)
