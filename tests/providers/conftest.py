"""Fixtures: the Ollama-API emulator and tiny real HTTP servers, on loopback ports."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from starlette.types import ASGIApp

from kubemoot.emulation.server import EmulatedModel, EmulatorConfig, OllamaEmulator
from kubemoot.serving import bind_socket, server_config, socket_url
from kubemoot.testing.emulators import emulator_factory

SMALL = EmulatedModel("small:1b", 1000, kv_mib_per_1k_tokens=8.0)
MEDIUM = EmulatedModel("medium:7b", 3000)
LARGE = EmulatedModel("large:30b", 6000)


#: An 8 GiB card whose waits are a hundredth of the emulated seconds. No reserve, so
#: the sizes in these tests are what the card offers (a test of the reserve sets one);
#: keep-alive counts emulated seconds, so 30000 keeps idle models for 300 real ones.
FAST_CARD: dict[str, object] = {
    "models": (SMALL, MEDIUM, LARGE), "vram_mib": 8192, "reserve_mib": 0, "num_parallel": 1,
    "context_length": 1024, "load_rate_mibps": 1000.0, "base_latency_s": 0.5,
    "per_token_s": 0.0, "time_scale": 0.01, "keep_alive_s": 30000.0,
}


def fast_config(**overrides: object) -> EmulatorConfig:
    """:data:`FAST_CARD` with ``overrides``."""
    return EmulatorConfig(**{**FAST_CARD, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., OllamaEmulator]]:
    with emulator_factory(FAST_CARD) as make:
        yield make


@pytest.fixture
def emulator(make_emulator: Callable[..., OllamaEmulator]) -> OllamaEmulator:
    return make_emulator()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextmanager
def serve_app(app: ASGIApp) -> Iterator[str]:
    """Serve any ASGI app on a free loopback port for the duration of the block."""
    sock = bind_socket("127.0.0.1", 0)
    # bounded drain: a misbehaving test server cannot hold the test's teardown
    server = uvicorn.Server(server_config(app, drain_seconds=1, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    ready = threading.Event()
    while not server.started and thread.is_alive():
        ready.wait(0.01)
    try:
        yield socket_url(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
