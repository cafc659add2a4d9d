"""The OpenAI-compatible surface, translated to and from Ollama's native API.

The gateway forwards every call in Ollama's shape (every provider speaks it), so the
OpenAI routes are a pure translation: request body in, reply or stream chunks out.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import time
import uuid
from collections.abc import Mapping
from typing import Any

from kubemoot.gateway.errors import GatewayError
from kubemoot.gateway.requests import bool_field, model_name

__all__ = [
    "EMBEDDING_ENCODINGS",
    "chat_body",
    "chat_chunk",
    "chat_completion",
    "embedding_encoding",
    "embeddings_body",
    "embeddings_reply",
    "finish_reason",
    "model_entry",
    "one_choice",
    "sampling_options",
    "unfinished",
    "usage",
    "usage_chunk",
]

# OpenAI sampling parameters and the Ollama option each one is.
_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed",
            "max_tokens": "num_predict", "max_completion_tokens": "num_predict",
            "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
            "stop": "stop"}


def _content(value: object, where: str) -> str:
    """Message content: a string, or a list of parts whose text parts are joined."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict):
                raise GatewayError(400, f"{where} parts must be objects")
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise GatewayError(400, f"{where} must be a string or a list of parts")


def _message(index: int, message: object) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise GatewayError(400, f"{where} must be an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise GatewayError(400, f"{where}.role is required")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _content(message.get("content"), f"{where}.content")}
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise GatewayError(400, f"{where}.tool_calls must be a list")
        out["tool_calls"] = [_tool_call_in(f"{where}.tool_calls[{i}]", c)
                             for i, c in enumerate(calls)]
    if role == "tool" and isinstance(message.get("name"), str):
        out["tool_name"] = message["name"]
    return out


def _tool_call_in(where: str, call: object) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise GatewayError(400, f"{where}.function is required")
    function = call["function"]
    arguments = function.get("arguments") or "{}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise GatewayError(400, f"{where}.function.arguments is not JSON") from None
    return {"function": {"name": function.get("name"), "arguments": arguments}}


def one_choice(body: Mapping[str, Any]) -> None:
    """Refuse ``n`` (and ``best_of``) above 1: an engine call writes one answer, and a
    reply with one choice where the client asked for several would be silently wrong."""
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GatewayError(400, f"{name} must be a positive integer")
        if value > 1:
            raise GatewayError(400, f"{name}={value} is not supported: the kubemoot gateway "
                               f"answers one choice per call; send {value} calls instead",
                               code="unsupported_value")


def sampling_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI sampling parameters of ``body`` as Ollama ``options``."""
    options: dict[str, Any] = {}
    for name, option in _OPTIONS.items():
        value = body.get(name)
        if value is not None:
            if name != "stop" and (isinstance(value, bool)
                                   or not isinstance(value, int | float)):
                raise GatewayError(400, f"{name} must be a number")
            options[option] = [value] if name == "stop" and isinstance(value, str) else value
    return options


def chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """``/v1/chat/completions`` → an ``/api/chat`` body."""
    model = model_name(body)
    one_choice(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "messages must be a non-empty list")
    out: dict[str, Any] = {
        "model": model,
        "messages": [_message(i, m) for i, m in enumerate(messages)],
        "stream": bool_field(body, "stream", False),
    }
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise GatewayError(400, "tools must be a list of objects")
        out["tools"] = tools
    options = sampling_options(body)
    if options:
        out["options"] = options
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["format"] = "json"
    elif isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = fmt.get("json_schema")
        if isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
            out["format"] = schema["schema"]
    return out


def include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def new_id(prefix: str = "chatcmpl") -> str:
    """A reply's id: 24 random hex digits after the prefix, as OpenAI's look. Drawn as
    12 random bytes: a ``uuid4`` (its object built in Python) cost more than the rest of
    the id, on every call of the OpenAI routes."""
    return f"{prefix}-{os.urandom(12).hex()}"


def _tool_calls_out(calls: object) -> list[dict[str, Any]]:
    out = []
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments", {})
        out.append({
            "index": index, "id": f"call_{uuid.uuid4().hex[:16]}", "type": "function",
            "function": {"name": function.get("name"),
                         "arguments": arguments if isinstance(arguments, str)
                         else json.dumps(arguments)},
        })
    return out


def finish_reason(reply: Mapping[str, Any], has_calls: bool = False) -> str:
    if has_calls:
        return "tool_calls"
    return "length" if reply.get("done_reason") == "length" else "stop"


def usage(reply: Mapping[str, Any]) -> dict[str, int]:
    prompt = int(reply.get("prompt_eval_count") or 0)
    completion = int(reply.get("eval_count") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def chat_completion(reply: Mapping[str, Any], *, model: str, call_id: str) -> dict[str, Any]:
    """An ``/api/chat`` answer → a ``chat.completion`` object."""
    message = reply.get("message") if isinstance(reply.get("message"), dict) else {}
    assert isinstance(message, dict)
    calls = _tool_calls_out(message.get("tool_calls"))
    out_message: dict[str, Any] = {"role": "assistant",
                                   "content": message.get("content") or ""}
    if calls:
        out_message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"}
                                     for c in calls]
    return {
        "id": call_id, "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": out_message,
                     "finish_reason": finish_reason(reply, bool(calls)), "logprobs": None}],
        "usage": usage(reply),
    }


def chat_chunk(line: Mapping[str, Any], *, model: str, call_id: str,
               first: bool) -> dict[str, Any]:
    """One ``/api/chat`` stream line → one ``chat.completion.chunk``."""
    message = line.get("message") if isinstance(line.get("message"), dict) else {}
    assert isinstance(message, dict)
    delta: dict[str, Any] = {"role": "assistant"} if first else {}
    if message.get("content"):
        delta["content"] = message["content"]
    calls = _tool_calls_out(message.get("tool_calls"))
    if calls:
        delta["tool_calls"] = calls
    done = bool(line.get("done"))
    return {
        "id": call_id, "object": "chat.completion.chunk", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta,
                     "finish_reason": finish_reason(line, bool(calls)) if done else None,
                     "logprobs": None}],
    }


def unfinished(provider: str | None) -> dict[str, Any]:
    """The error event of a stream whose engine stopped without its ``done`` line, the
    last line of every whole Ollama answer: what came is not the whole answer."""
    return {"error": {"message": f"the answer from provider {provider} ended before it "
                      "was complete (no final done line)", "type": "server_error",
                      "code": "provider_error"}}


def usage_chunk(line: Mapping[str, Any], *, model: str, call_id: str) -> dict[str, Any]:
    """The extra last chunk ``stream_options.include_usage`` asks for."""
    return {"id": call_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": [], "usage": usage(line)}


def embeddings_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """``/v1/embeddings`` → an ``/api/embed`` body."""
    model = model_name(body)
    value = body.get("input")
    if isinstance(value, str):
        inputs: list[str] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        inputs = list(value)
    else:
        raise GatewayError(400, "input must be a string or a non-empty list of strings")
    return {"model": model, "input": inputs}


#: ``encoding_format`` values OpenAI defines; ``float`` is the default.
EMBEDDING_ENCODINGS = ("float", "base64")


def embedding_encoding(body: Mapping[str, Any]) -> str:
    """``encoding_format``: ``float`` (the default) or ``base64``; anything else is a 400."""
    value = body.get("encoding_format")
    if value is None:
        return "float"
    if value not in EMBEDDING_ENCODINGS:
        raise GatewayError(400, f"encoding_format must be float or base64, got "
                           f"{json.dumps(value)[:40]}")
    return str(value)


def _encoded(vector: object, encoding: str) -> object:
    """A vector as OpenAI sends it: a list of floats, or base64 of little-endian float32
    (what the ``openai`` client asks for unless told otherwise, and decodes itself)."""
    if encoding != "base64" or not isinstance(vector, list):
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def embeddings_reply(reply: Mapping[str, Any], *, model: str,
                     encoding: str = "float") -> dict[str, Any]:
    vectors = reply.get("embeddings") or []
    prompt = int(reply.get("prompt_eval_count") or 0)
    return {
        "object": "list", "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": _encoded(v, encoding)}
                 for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def model_entry(name: str, *, created: int = 0, owned_by: str = "kubemoot") -> dict[str, Any]:
    """One ``/v1/models`` entry; ``created`` is the model's modified time (epoch seconds)."""
    return {"id": name, "object": "model", "created": created, "owned_by": owned_by}
