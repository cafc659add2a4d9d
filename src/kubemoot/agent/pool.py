"""A pool of chat clients, one per (endpoint, model, call settings), built lazily.

A client fixed to one endpoint at start-up is the wrong shape when the endpoint is
chosen per call. The pool hands out a :class:`PooledChat` for whatever provider and
model the runtime just placed the call on, creating the underlying client on first use
and reusing it afterwards. The factory is the only place that knows which adapter
(Ollama, the emulator, a simulated engine) stands behind an endpoint; bounded retries
(at most one) are that adapter's job, so the pool never retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubemoot.providers.protocol import ChatResult, ProviderClient

__all__ = ["CallSettings", "ChatPool", "ClientFactory", "PoolKey", "PooledChat"]


@dataclass(frozen=True, slots=True)
class CallSettings:
    """Per-call settings that make a distinct client (part of the pool key)."""

    temperature: float | None = None
    max_tokens: int | None = None  # the output cap: a reply past the context ends early
    #: Per-read timeout of the client; None: the deployment's
    #: (``KUBEMOOT_PROVIDER_READ_TIMEOUT_SECONDS``).
    timeout: float | None = None
    think: bool | None = None

    def options(self) -> dict[str, Any]:
        """Engine options for these settings (Ollama's names)."""
        out: dict[str, Any] = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.max_tokens is not None:
            out["num_predict"] = self.max_tokens
        return out


@dataclass(frozen=True, slots=True)
class PoolKey:
    endpoint: str
    model: str
    settings: CallSettings


ClientFactory = Callable[[str, str, CallSettings], ProviderClient]
"""``factory(provider_name, endpoint, settings)`` → a client for that endpoint."""


class PooledChat:
    """A client bound to one model and one set of call settings."""

    def __init__(
        self, client: ProviderClient, *, provider: str, model: str, settings: CallSettings,
        keep_alive: float | None = None,
    ) -> None:
        self.client = client
        self.provider = provider
        self.model = model
        self.settings = settings
        self.keep_alive = keep_alive

    @property
    def endpoint(self) -> str:
        return self.client.endpoint

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        num_ctx: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ChatResult:
        return await self.client.chat(
            self.model,
            messages,
            num_ctx=num_ctx,
            tools=tools,
            options=self.settings.options() or None,
            keep_alive=self.keep_alive,
        )


class ChatPool:
    """Lazily built chat clients keyed by endpoint, model and settings."""

    def __init__(self, factory: ClientFactory, *, keep_alive: float | None = None) -> None:
        # Every chat asks the engine for the runtime's keep-alive, as the gateway and the
        # simulator do: the engine's own default (5 min in Ollama) would unload a copy
        # the runtime still counts on for its warm calls.
        self._factory = factory
        self._keep_alive = keep_alive
        self._chats: dict[PoolKey, PooledChat] = {}
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._chats)

    def get(
        self,
        *,
        provider: str,
        endpoint: str,
        model: str,
        settings: CallSettings | None = None,
    ) -> PooledChat:
        """The chat for this placement, creating its client on first use."""
        key = PoolKey(endpoint, model, settings or CallSettings())
        chat = self._chats.get(key)
        if chat is None:
            client = self._factory(provider, endpoint, key.settings)
            chat = PooledChat(client, provider=provider, model=model, settings=key.settings,
                              keep_alive=self._keep_alive)
            self._chats[key] = chat
        return chat

    async def close(self) -> None:
        """Close every client the pool built (each once)."""
        async with self._lock:
            chats, self._chats = list(self._chats.values()), {}
        seen: set[int] = set()
        for chat in chats:
            if id(chat.client) not in seen:
                seen.add(id(chat.client))
                await chat.client.close()
