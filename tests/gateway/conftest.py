"""Fixtures: a real gateway in front of two real Ollama-API emulators, embedded store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import pytest

from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.gateway import GatewayServer, ProviderSource
from kubemoot.gateway.keys import ApiKeys
from kubemoot.runtime.calls import CallRecord
from kubemoot.settings import GatewaySettings
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.emulators import emulator_factory

SMALL = EmulatedModel("small:1b", 1000, family="small")
MEDIUM = EmulatedModel("medium:7b", 4000, family="medium")
LATEST = EmulatedModel("plain:latest", 1000, family="plain")
HUGE = EmulatedModel("huge:70b", 40000, family="huge")

#: A small emulated card; waits are a thousandth of the emulated seconds.
CARD: dict[str, object] = {
    # the card keeps the reserve the providers below declare to the runtime
    "models": (SMALL, MEDIUM, LATEST, HUGE), "vram_mib": 8192, "reserve_mib": 512,
    "num_parallel": 2,
    "context_length": 1024, "base_latency_s": 0.5, "per_token_s": 0.0,
    "time_scale": 0.001, "keep_alive_s": 300_000.0,
}


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., OllamaEmulator]]:
    with emulator_factory(CARD) as make:
        yield make


@dataclass
class Fleet:
    gateway: GatewayServer
    emulators: dict[str, OllamaEmulator]
    finished: Finished

    @property
    def url(self) -> str:
        return self.gateway.url

    async def tickets_left(self) -> list[str]:
        """The unexpired tickets in the store's documents (``provider/holder``): what a
        call that ended must not leave behind (the desk's own list could be empty while
        a document still holds one)."""
        return await live_tickets(self.gateway)


def sources(emulators: dict[str, OllamaEmulator]) -> list[ProviderSource]:
    return [ProviderSource(name, e.url, context_length=1024, num_parallel=2,
                           reserve_mib=512, total_vram_mib=8192)
            for name, e in emulators.items()]


async def start_gateway(emulators: dict[str, OllamaEmulator], **kwargs: object
                        ) -> GatewayServer:
    settings = kwargs.pop("settings", None) or GatewaySettings(wait_limit_seconds=5.0)
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=sources(emulators), port=0,
                            settings=settings, **kwargs)  # type: ignore[arg-type]
    await gateway.start()
    return gateway


@pytest.fixture
async def fleet(make_emulator: Callable[..., OllamaEmulator]) -> AsyncIterator[Fleet]:
    emulators = {"gpu-a": make_emulator(), "gpu-b": make_emulator()}
    gateway = await start_gateway(emulators)
    try:
        yield Fleet(gateway, emulators, finished_calls(gateway))
    finally:
        await gateway.stop()


@pytest.fixture
async def quiet_card(make_emulator: Callable[..., OllamaEmulator]) -> AsyncIterator[Fleet]:
    """One card, probed once at start-up only: no timed probe lands among the calls."""
    emulators = {"gpu-a": make_emulator()}
    settings = GatewaySettings(wait_limit_seconds=5.0, provider_probe_seconds=3600.0)
    gateway = await start_gateway(emulators, settings=settings)
    try:
        yield Fleet(gateway, emulators, finished_calls(gateway))
    finally:
        await gateway.stop()


@pytest.fixture
async def keyed(make_emulator: Callable[..., OllamaEmulator]) -> AsyncIterator[Fleet]:
    emulators = {"gpu-a": make_emulator()}
    gateway = await start_gateway(emulators, keys=ApiKeys({"alice": "sk-alice-secret"}))
    try:
        yield Fleet(gateway, emulators, finished_calls(gateway))
    finally:
        await gateway.stop()


class Finished:
    """The calls a gateway has finished, in order, and a way to wait for the n-th.

    A desk listener: the desk tells its listeners about a call after it released the
    call's ticket and left ``in_flight``, so "n calls finished" is the event to wait on
    before looking for leftovers.
    """

    def __init__(self) -> None:
        self.records: list[CallRecord] = []
        self._changed = asyncio.Event()

    def __call__(self, record: CallRecord) -> None:
        self.records.append(record)
        self._changed.set()

    async def until(self, count: int, *, timeout: float = 30.0) -> None:
        try:
            async with asyncio.timeout(timeout):
                while len(self.records) < count:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"{len(self.records)} of {count} calls finished") from None


def finished_calls(gateway: GatewayServer) -> Finished:
    """Follow the calls ``gateway`` finishes from now on."""
    assert gateway.desk is not None
    finished = Finished()
    gateway.desk.calls.listeners.append(finished)
    return finished


async def live_tickets(gateway: GatewayServer) -> list[str]:
    """Every unexpired ticket in the store, as ``provider/holder``."""
    from kubemoot.store.documents import ProviderTickets

    assert gateway.stack is not None
    bucket = gateway.stack.tickets_bucket
    now = gateway.clock.now()
    found = []
    for key in await bucket.keys():
        entry = await bucket.get(key)
        if entry is None:
            continue
        doc = ProviderTickets.from_json(entry.value)
        found += [f"{doc.provider}/{t.holder_id}" for t in doc.tickets if t.expires_at > now]
    return found
