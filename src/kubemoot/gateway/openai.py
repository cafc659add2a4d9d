"""The OpenAI-compatible surface, translated to and from Ollama's native API.

The gateway forwards every call in Ollama's shape (every provider speaks it), so the
OpenAI routes are a pure translation: request body in, reply or stream chunks out.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from kubemoot.gateway.errors import GatewayError
from kubemoot.gateway.requests import bool_field, model_name

__all__ = [
    "chat_body",
    "chat_chunk",
    "chat_completion",
    "embeddings_body",
    "embeddings_reply",
    "model_entry",
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


def chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """``/v1/chat/completions`` → an ``/api/chat`` body."""
    model = model_name(body)
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
    options: dict[str, Any] = {}
    for name, option in _OPTIONS.items():
        value = body.get(name)
        if value is not None:
            if name != "stop" and (isinstance(value, bool)
                                   or not isinstance(value, int | float)):
                raise GatewayError(400, f"{name} must be a number")
            options[option] = [value] if name == "stop" and isinstance(value, str) else value
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


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


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


def _finish(reply: Mapping[str, Any], has_calls: bool) -> str:
    if has_calls:
        return "tool_calls"
    return "length" if reply.get("done_reason") == "length" else "stop"


def _usage(reply: Mapping[str, Any]) -> dict[str, int]:
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
                     "finish_reason": _finish(reply, bool(calls)), "logprobs": None}],
        "usage": _usage(reply),
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
                     "finish_reason": _finish(line, bool(calls)) if done else None,
                     "logprobs": None}],
    }


def usage_chunk(line: Mapping[str, Any], *, model: str, call_id: str) -> dict[str, Any]:
    """The extra last chunk ``stream_options.include_usage`` asks for."""
    return {"id": call_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": [], "usage": _usage(line)}


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


def embeddings_reply(reply: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    vectors = reply.get("embeddings") or []
    prompt = int(reply.get("prompt_eval_count") or 0)
    return {
        "object": "list", "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": v}
                 for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def model_entry(name: str, *, owned_by: str = "kubemoot") -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": owned_by}
