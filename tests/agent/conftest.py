"""Fixtures: real Ollama-API emulators on loopback, reached through the real adapter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from kubemoot.agent.pool import CallSettings, ChatPool
from kubemoot.providers.emulator import EmulatedModel, EmulatorConfig, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.protocol import ProviderClient

TINY = EmulatedModel("tiny:1b", 1000)


def fast_config(**overrides: object) -> EmulatorConfig:
    """A small emulated card whose waits are a thousandth of the emulated seconds."""
    settings: dict[str, object] = {
        "models": (TINY,), "vram_mib": 8192, "num_parallel": 2, "context_length": 1024,
        "base_latency_s": 0.5, "per_token_s": 0.0, "time_scale": 0.001,
    }
    settings.update(overrides)
    return EmulatorConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., OllamaEmulator]]:
    started: list[OllamaEmulator] = []

    def make(**overrides: object) -> OllamaEmulator:
        emulator = OllamaEmulator(fast_config(**overrides)).start()
        started.append(emulator)
        return emulator

    yield make
    for emulator in started:
        emulator.stop()


def ollama_factory(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
    return OllamaProvider(provider, endpoint, timeout=settings.timeout)


@pytest.fixture
async def pool() -> AsyncIterator[ChatPool]:
    chat_pool = ChatPool(ollama_factory)
    yield chat_pool
    await chat_pool.close()
