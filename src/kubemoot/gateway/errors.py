"""The gateway's error answers, in the two shapes its clients parse.

Ollama routes answer ``{"error": "…"}``; OpenAI routes answer
``{"error": {"message", "type", "code"}}``. One :class:`GatewayError` carries the
status, the message, the OpenAI code and any headers (``Retry-After``); the route
family decides the shape when the answer is written. :func:`refusal_error` is the one
place a runtime refusal becomes an answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kubemoot.gateway.jsoncodec import JsonReply
from kubemoot.runtime.refusals import (
    GpuBusy,
    MemoryUnknown,
    ModelTooLarge,
    ModelUnknown,
    PromptTooLarge,
    ProviderDown,
    Refusal,
    StateStale,
)

__all__ = ["GatewayError", "as_asked", "error_response", "refusal_error", "unknown_model"]

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 404: "invalid_request_error", 413: "invalid_request_error",
                 501: "invalid_request_error", 503: "server_error"}


@dataclass(slots=True)
class GatewayError(Exception):
    """An answer that is not a reply: status, message for people, OpenAI code."""

    status: int
    message: str
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


def error_response(error: GatewayError, *, openai: bool,
                   extra_headers: Mapping[str, str] | None = None) -> JsonReply:
    """``error`` as a JSON answer in the route family's shape."""
    headers = {**error.headers, **(extra_headers or {})}
    if openai:
        body: object = {"error": {
            "message": error.message,
            "type": _OPENAI_TYPES.get(error.status, "api_error"),
            "code": error.code,
        }}
    else:
        body = {"error": error.message}
    return JsonReply(body, status_code=error.status, headers=headers)


def as_asked(asked: str, models: Sequence[str]) -> str:
    """The model as the client named it; a ModelClass also lists what it stands for."""
    if asked in models:
        return f'"{asked}"'
    return f'"{asked}" ({", ".join(models)})'


def refusal_error(refusal: Refusal, *, name: str, budget: float, retry_after: int,
                  num_ctx: int | None = None, where: str | None = None) -> GatewayError:
    """The one translation of a runtime refusal into HTTP (DESIGN §9).

    ``name``: the model as asked (:func:`as_asked`); ``budget``: the call's wait budget;
    ``retry_after``: whole seconds for ``Retry-After`` on the answers where waiting
    helps; ``num_ctx``: the client's ``options.num_ctx``; ``where``: what a too-large
    prompt was measured against, when not the model (``options.num_ctx``).
    """
    retry = {"Retry-After": str(retry_after)}
    match refusal:
        case ModelUnknown(name=model):
            return unknown_model(model)
        case ProviderDown(providers=down):
            return GatewayError(
                503, f"the providers that could run {name} do not answer "
                f"({', '.join(down)}); the model is not missing, its servers are down; "
                f"retry in about {retry_after} s", code="provider_unavailable",
                headers=retry)
        case StateStale(providers=stale, max_age_seconds=limits, waited=waited):
            said = ", ".join(f"{p} last probed {age:.0f} s ago (limit {limit:.0f} s)"
                             for p, age, limit in zip(stale, refusal.ages(), limits,
                                                      strict=True))
            return GatewayError(
                503, f"the providers that could run {name} have no fresh state: {said}; "
                "whoever probes them (the gateway or operator serving them) has stopped "
                f"publishing, so nothing is placed there; waited {waited:.1f} s for a "
                f"fresh probe; retry in about {retry_after} s",
                code="provider_state_stale", headers=retry)
        case MemoryUnknown(providers=unknown):
            return GatewayError(
                400, f"{name} has no loaded copy, and the only providers that could load "
                f"one have no known memory total ({', '.join(unknown)}); give each its "
                "vramMiB (in --provider, or totalVramMiB in its ModelProvider) so that "
                "loads can be placed", code="memory_unknown")
        case ModelTooLarge(need_mib=need, largest_usable_mib=usable, largest_provider=card):
            message = f"model {name} is larger than the usable memory of every GPU in the fleet"
            if need is not None and usable is not None:
                message += (f": it needs {need} MiB, and the largest usable memory in the "
                            f"fleet is {usable} MiB on {card} (its VRAM total less its "
                            "reserve)")
            return GatewayError(400, message, code="model_too_large")
        case PromptTooLarge(tokens=tokens, largest_context=largest):
            error = prompt_too_large(tokens, largest, where or f"model {name}")
            if where is None and num_ctx is not None and (largest is None or num_ctx > largest):
                # a copy loaded at the client's num_ctx would take a KV cache no ticket
                # sized, so the option cannot open a larger context than the fleet runs
                error.message += (f"; options.num_ctx ({num_ctx}) is not used to load a "
                                  "copy with a larger context than its provider runs")
            return error
        case GpuBusy(waited=waited):
            return GatewayError(
                503, f"every GPU that can run {name} is busy; waited {waited:.1f} s of a "
                f"{budget:g} s budget (X-Kubemoot-Wait-Budget); retry in about "
                f"{retry_after} s", code="gpu_busy", headers=retry)


def prompt_too_large(tokens: int, largest: int | None, where: str) -> GatewayError:
    context = f"{largest} tokens" if largest is not None else "unknown"
    return GatewayError(
        400, f"the prompt is about {tokens} tokens, more than the largest context "
        f"available for {where} ({context}); the gateway never cuts a prompt",
        code="context_length_exceeded")


def unknown_model(name: str) -> GatewayError:
    """404 in Ollama's wording (clients match on it)."""
    return GatewayError(404, f'model "{name}" not found, try pulling it first',
                        code="model_not_found")
