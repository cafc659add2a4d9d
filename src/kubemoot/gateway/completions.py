"""OpenAI's legacy ``POST /v1/completions``, translated to and from ``/api/generate``.

Editors and older tools (Continue's autocomplete, aider's FIM models, scripts written
against the first OpenAI API) send a bare prompt, often with a ``suffix`` for
fill-in-the-middle. Ollama's ``/api/generate`` takes both, so the translation is
pure: a body in, a ``text_completion`` (or its SSE chunks) out.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from kubemoot.gateway import openai as oai
from kubemoot.gateway.errors import GatewayError
from kubemoot.gateway.requests import bool_field, model_name

__all__ = ["completion", "completion_events", "generate_body"]


def _prompt(body: Mapping[str, Any]) -> str:
    """``prompt``: a string, or a list holding one string (each string would be a
    choice of its own, which the gateway does not answer with one call)."""
    value = body.get("prompt")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, str) for v in value):
        raise GatewayError(400, f"prompt lists {len(value)} prompts; the kubemoot gateway "
                           "answers one prompt per call", code="unsupported_value")
    raise GatewayError(400, "prompt must be a string (token arrays are not supported)")


def _optional_text(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None or isinstance(value, str):
        return value
    raise GatewayError(400, f"{name} must be a string")


def generate_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """``/v1/completions`` → an ``/api/generate`` body (``suffix`` passed on for FIM)."""
    model = model_name(body)
    oai.one_choice(body)
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0, False):
        raise GatewayError(400, "logprobs is not supported by the kubemoot gateway",
                           code="unsupported_value")
    out: dict[str, Any] = {"model": model, "prompt": _prompt(body),
                           "stream": bool_field(body, "stream", False)}
    suffix = _optional_text(body, "suffix")
    if suffix:
        out["suffix"] = suffix
    options = oai.sampling_options(body)
    if options:
        out["options"] = options
    return out


def _echoed(body: Mapping[str, Any]) -> str:
    """The prompt again when ``echo`` asks for it, else nothing."""
    return _prompt(body) if bool_field(body, "echo", False) else ""


def _choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}


def completion(reply: object, body: Mapping[str, Any], *, model: str,
               call_id: str) -> dict[str, Any]:
    """An ``/api/generate`` answer → a ``text_completion`` object."""
    if not isinstance(reply, dict):
        raise GatewayError(502, "the provider's answer is not an object")
    text = _echoed(body) + str(reply.get("response") or "")
    return {"id": call_id, "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [_choice(text, oai.finish_reason(reply))],
            "usage": oai.usage(reply)}


async def completion_events(lines: AsyncIterator[bytes], body: Mapping[str, Any], *,
                            model: str, call_id: str,
                            provider: str | None = None) -> AsyncIterator[bytes]:
    """An ``/api/generate`` NDJSON stream → ``text_completion`` SSE chunks, ``[DONE]``."""
    usage = oai.include_usage(body)
    echo = _echoed(body)

    def chunk(text: str, finish: str | None) -> dict[str, Any]:
        return {"id": call_id, "object": "text_completion", "created": int(time.time()),
                "model": model, "choices": [_choice(text, finish)]}

    if echo:
        yield _sse(chunk(echo, None))
    ended = False
    async for raw in lines:
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):  # too deep a line is as broken as a torn one
            continue
        if not isinstance(line, dict):
            continue
        if "error" in line:
            yield _sse({"error": {"message": str(line["error"]), "type": "server_error",
                                  "code": "provider_error"}})
            break
        done = bool(line.get("done"))
        ended = ended or done
        yield _sse(chunk(str(line.get("response") or ""),
                         oai.finish_reason(line) if done else None))
        if done and usage:
            yield _sse({**chunk("", None), "choices": [], "usage": oai.usage(line)})
    else:
        if not ended:  # an Ollama stream ends with its done line: this one is cut
            yield _sse(oai.unfinished(provider))
    yield b"data: [DONE]\n\n"


def _sse(value: object) -> bytes:
    return f"data: {json.dumps(value, separators=(',', ':'))}\n\n".encode()
