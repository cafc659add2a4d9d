"""Fixtures: real Ollama-API emulators on loopback, reached through the real adapter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from kubemoot.agent.pool import CallSettings, ChatPool
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.protocol import ProviderClient
from kubemoot.testing.emulators import emulator_factory

TINY = EmulatedModel("tiny:1b", 1000)


#: A small emulated card whose waits are a thousandth of the emulated seconds.
FAST_CARD: dict[str, object] = {
    # the card keeps the reserve the tests declare to the runtime
    "models": (TINY,), "vram_mib": 8192, "reserve_mib": 512, "num_parallel": 2,
    "context_length": 1024,
    "base_latency_s": 0.5, "per_token_s": 0.0, "time_scale": 0.001,
    "keep_alive_s": 300_000.0,
}


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., OllamaEmulator]]:
    with emulator_factory(FAST_CARD) as make:
        yield make


def ollama_factory(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
    return OllamaProvider(provider, endpoint, timeout=settings.timeout)


@pytest.fixture
async def pool() -> AsyncIterator[ChatPool]:
    chat_pool = ChatPool(ollama_factory)
    yield chat_pool
    await chat_pool.close()
