"""The provider protocol: what the runtime, the agent and the simulator call.

A *provider* is one inference engine endpoint (an Ollama server, the emulator, a
simulated GPU). Everything above this seam sees only :class:`ProviderClient` and the
errors below; adapters map their foreign exceptions (httpx, ollama) to these at their
edge, so no network library leaks inward. This module imports no network library.

Error tree::

    ProviderError              base; the message names the provider and endpoint
    ├── ProviderUnavailable    refused connection, DNS failure, reset: nobody answered
    ├── ProviderTimeout        the engine did not answer within the timeout
    │   └── ProviderDeadlineExceeded   the whole call outlived its deadline
    ├── ProviderBadResponse    5xx, or a body that is malformed, truncated or hostile
    └── ModelNotFound          the engine does not have the model (HTTP 404)

``provider_fault`` says whether an error counts against the provider's circuit: the
first three are the engine's (or its host's) fault; a missing model or another 4xx is
the caller's. Only a :class:`ProviderUnavailable` with ``sent`` false (the connection
was refused before any byte of the request left) may be tried again: a timed-out
request may still be running on the engine, so repeating it would double the work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from kubemoot.store.documents import ProviderState, ResidentModel

__all__ = [
    "ChatResult",
    "ModelNotFound",
    "ProviderBadResponse",
    "ProviderClient",
    "ProviderDeadlineExceeded",
    "ProviderError",
    "ProviderState",
    "ProviderTimeout",
    "ProviderUnavailable",
    "ResidentModel",
]


class ProviderError(Exception):
    """Base of every provider error; the message names the provider and endpoint."""

    #: Whether the error is the provider's fault (it opens circuits) or the caller's.
    provider_fault: ClassVar[bool] = False

    def __init__(self, message: str, *, provider: str | None = None,
                 endpoint: str | None = None) -> None:
        self.message = message
        self.provider = provider
        self.endpoint = endpoint
        super().__init__(message)

    def __str__(self) -> str:
        # built on demand: an adapter may fill in provider/endpoint after raising
        parts = (self.provider, f"({self.endpoint})" if self.endpoint else None)
        where = " ".join(p for p in parts if p)
        return f"{where}: {self.message}" if where else self.message


class ProviderUnavailable(ProviderError):
    """Nobody answered: connection refused, name not resolved, connection reset.

    ``sent`` is false only when the request certainly never reached the engine (the
    connection was refused or the name did not resolve); a reset mid-request may have
    started work there.
    """

    provider_fault = True

    def __init__(self, message: str, *, provider: str | None = None,
                 endpoint: str | None = None, sent: bool = True) -> None:
        self.sent = sent
        super().__init__(message, provider=provider, endpoint=endpoint)


class ProviderTimeout(ProviderError):
    """The engine took longer than the configured timeout."""

    provider_fault = True


class ProviderDeadlineExceeded(ProviderTimeout):
    """The whole call (every read, every retry) outlived its deadline.

    A per-read timeout cannot bound a call to a server that sends a byte now and then;
    the deadline does.
    """


class ProviderBadResponse(ProviderError):
    """The engine answered, but with a 5xx or a body we cannot trust."""

    provider_fault = True

    def __init__(self, message: str, *, provider: str | None = None,
                 endpoint: str | None = None, status: int | None = None) -> None:
        self.status = status
        super().__init__(message, provider=provider, endpoint=endpoint)


class ModelNotFound(ProviderError):
    """The engine does not know the model (HTTP 404)."""

    def __init__(self, message: str, *, provider: str | None = None,
                 endpoint: str | None = None, model: str | None = None) -> None:
        self.model = model
        super().__init__(message, provider=provider, endpoint=endpoint)


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One chat completion, with the engine's own token counts.

    ``prompt_eval_count`` is the prompt size the engine actually evaluated, which is
    what the context guard builds on (after a silent truncation it is the cut size).
    ``compute_seconds`` is the engine's time on the reply once the model was loaded
    (``total_duration`` less ``load_duration``): the reply's arrival less it is when
    inference started, which ends the call's *wait*.
    """

    model: str
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    done_reason: str | None = None
    compute_seconds: float | None = None


@runtime_checkable
class ProviderClient(Protocol):
    """One inference endpoint, as the runtime sees it."""

    name: str
    endpoint: str

    async def probe(self) -> ProviderState:
        """What the engine holds now; raises a :class:`ProviderError` when it can't say."""
        ...

    async def preload(self, model: str) -> None:
        """Load ``model`` into VRAM without generating anything."""
        ...

    async def unload(self, model: str) -> None:
        """Drop ``model`` from VRAM now."""
        ...

    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        num_ctx: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: float | None = None,
    ) -> ChatResult:
        """One non-streaming chat call; ``num_ctx`` is the per-request context and
        ``keep_alive`` (seconds) how long the engine keeps the model after it (None:
        the engine's default)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
