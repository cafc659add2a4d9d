"""A pinned model: loaded at start, never a victim, loaded again when its server lost it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.gateway import GatewayServer
from kubemoot.providers.prober import Prober
from kubemoot.settings import GatewaySettings
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import SMALL, EmulatedModel, OllamaEmulator, sources

BIG = EmulatedModel("big:5b", 4800, family="big")
HELLO = {"messages": [{"role": "user", "content": "hello"}], "stream": False}


def _published(prober: Prober) -> set[str]:
    return {m.name for m in prober.last_states["gpu"].loaded_models}


def _resident(emulator: OllamaEmulator) -> set[str]:
    return {model.name for model, _copy in emulator.engine.copies()}


@pytest.mark.parametrize("pinned", [True, False])
async def test_a_pinned_copy_is_loaded_at_start_and_never_a_victim(
        make_emulator: Callable[..., OllamaEmulator], pinned: bool) -> None:
    # usable 6144 - 512 = 5632 MiB: small:1b and big:5b do not fit together
    emulator = make_emulator(models=(SMALL, BIG), vram_mib=6144)
    [source] = sources({"gpu": emulator})
    source = replace(source, total_vram_mib=6144, pinned=("small:1b",) if pinned else ())
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=[source], port=0,
                            settings=GatewaySettings(provider_probe_seconds=0.05))
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            if pinned:
                await emulator.until(lambda engine: bool(engine.copies()))
                assert _resident(emulator) == {"small:1b"}
            else:  # nothing loads what nobody asked for
                assert (await http.post("/api/chat", json={"model": "small:1b", **HELLO})
                        ).status_code == 200
            big = await http.post("/api/chat", json={"model": "big:5b", **HELLO},
                                  headers={"X-Kubemoot-Wait-Budget": "0"})
            if pinned:
                assert big.status_code == 503, big.text  # busy: the pin stays
                assert _resident(emulator) == {"small:1b"}
                # nor does a client's unload (keep_alive 0) take it away
                await http.post("/api/generate", json={"model": "small:1b", "keep_alive": 0})
                assert _resident(emulator) == {"small:1b"}
                # nor a call's short keep_alive: the engine is told to keep it
                said = await http.post("/api/chat", json={"model": "small:1b", **HELLO,
                                                          "keep_alive": "1s"})
                assert said.status_code == 200, said.text
                [(_model, copy)] = emulator.engine.copies()
                assert copy.keep_alive == math.inf
            else:
                assert big.status_code == 200, big.text
                assert big.headers["x-kubemoot-evicted"] == "small:1b"
    finally:
        await gateway.stop()


async def test_a_pinned_model_the_server_lost_is_loaded_again(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator()
    [source] = sources({"gpu": emulator})
    gateway = GatewayServer(MemoryKV(SystemClock()), port=0,
                            providers=[replace(source, pinned=("medium:7b",))],
                            settings=GatewaySettings(provider_probe_seconds=0.05))
    await gateway.start()
    try:
        await emulator.until(lambda engine: bool(engine.copies()))
        # the engine drops it behind the gateway's back (a restart, a client's keep_alive)
        async with httpx.AsyncClient(base_url=emulator.url) as http:
            await http.post("/api/generate", json={"model": "medium:7b", "keep_alive": 0})
        await emulator.until(lambda engine: not engine.copies())
        await emulator.until(lambda engine: bool(engine.copies()))
        assert _resident(emulator) == {"medium:7b"}
        assert emulator.engine.loads.count("medium:7b") == 2
    finally:
        await gateway.stop()


async def test_a_pin_withdrawn_gives_its_copy_the_ordinary_keep_alive(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator()
    [source] = sources({"gpu": emulator})
    gateway = GatewayServer(MemoryKV(SystemClock()), port=0,
                            providers=[replace(source, pinned=("small:1b",))],
                            settings=GatewaySettings(provider_probe_seconds=3600.0))
    await gateway.start()
    try:
        assert gateway.prober is not None
        prober = gateway.prober
        await wait_until(lambda: "small:1b" in _published(prober), timeout=30,
                         what="the pinned copy in gpu's state")
        [(_model, copy)] = emulator.engine.copies()
        assert copy.keep_alive == math.inf
        said = await gateway.reconfigure(providers=[source], declared={})
        assert said == ["server gpu pins nothing"]
        # at once, not when some later call happens to renew it
        [(_model, copy)] = emulator.engine.copies()
        assert copy.keep_alive == 1800.0  # what a call without keep_alive is given
        assert emulator.engine.loads.count("small:1b") == 1  # renewed, not loaded again
        assert gateway.stack is not None
        bucket = gateway.stack.tickets_bucket
        left = [t for key in await bucket.keys() if (entry := await bucket.get(key))
                for t in ProviderTickets.from_json(entry.value).tickets]
        assert left == []  # the ticket that held the copy went back
        # unpinned on a card that no longer holds the copy: nothing is loaded for it
        await gateway.reconfigure(providers=[replace(source, pinned=("medium:7b",))],
                                  declared={})
        await wait_until(lambda: "medium:7b" in _published(prober), timeout=30,
                         what="the pinned medium:7b in gpu's state")
        async with httpx.AsyncClient(base_url=emulator.url) as http:
            await http.post("/api/generate", json={"model": "medium:7b", "keep_alive": 0})
        await emulator.until(lambda engine: len(engine.copies()) == 1)
        await prober.probe_all()
        await gateway.reconfigure(providers=[source], declared={})
        assert [m.name for m, _ in emulator.engine.copies()] == ["small:1b"]
        assert emulator.engine.loads.count("medium:7b") == 1
    finally:
        await gateway.stop()
