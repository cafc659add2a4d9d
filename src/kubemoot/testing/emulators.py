"""Start Ollama-API emulators for tests and stop every one afterwards.

Each test suite picks its own card defaults (models, VRAM, time scale); the start/stop
bookkeeping is the same everywhere and lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from kubemoot.emulation.server import EmulatorConfig, OllamaEmulator

__all__ = ["emulator_factory"]


@contextmanager
def emulator_factory(
    defaults: Mapping[str, object],
) -> Iterator[Callable[..., OllamaEmulator]]:
    """Yield ``make(**overrides)``, which starts an emulator configured by ``defaults``
    updated with ``overrides``; every emulator it started is stopped on exit."""
    started: list[OllamaEmulator] = []

    def make(**overrides: object) -> OllamaEmulator:
        settings = {**defaults, **overrides}
        emulator = OllamaEmulator(EmulatorConfig(**settings)).start()  # type: ignore[arg-type]
        started.append(emulator)
        return emulator

    try:
        yield make
    finally:
        for emulator in started:
            emulator.stop()
