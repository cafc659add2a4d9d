"""The shared engine model on its own, in virtual time: what neither wrapper adds."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, TypeVar

import httpx
import pytest

from kubemoot.clock import LoopClock, ScaledClock
from kubemoot.emulation.engine import (
    CardSpec,
    EngineEvents,
    ModelExceedsCard,
    OllamaEngine,
    QueueFull,
    UnloadReason,
)
from kubemoot.emulation.server import EmulatorConfig, OllamaEmulator
from kubemoot.sim.vloop import run_virtual
from tests.providers.conftest import LARGE, SMALL

T = TypeVar("T")


class _Log(EngineEvents):
    def __init__(self) -> None:
        self.entries: list[tuple[str, str, float]] = []

    def load_started(self, model: str, mib: int, at: float) -> None:
        self.entries.append(("load", model, at))

    def unloaded(self, model: str, reason: UnloadReason, at: float) -> None:
        self.entries.append((reason.value, model, at))


def _card(log: _Log, **numbers: Any) -> OllamaEngine:
    """A 10 GiB card with a 1 GiB reserve, loading 1000 MiB/s, unloading in 1 s."""
    spec: dict[str, Any] = {"vram_mib": 10240, "reserve_mib": 1024, "load_rate_mibps": 1000.0,
                            "unload_seconds": 1.0, "keep_alive_seconds": 300.0, **numbers}
    return OllamaEngine("card", CardSpec(**spec), clock=LoopClock(epoch=0.0, anchor=0.0),
                        events=log)


def _virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_virtual(main())


async def _use(engine: OllamaEngine, model: str, mib: int, **kw: Any) -> None:
    got = await engine.acquire(model, mib, **kw)
    engine.release(got.copy)


def test_another_context_reloads_an_idle_copy_with_its_new_footprint() -> None:
    log = _Log()

    async def main() -> tuple[int | None, int]:
        engine = _card(log)
        await _use(engine, "m", 2000, context_length=1024)  # loaded 0–2 s
        await _use(engine, "m", 3000, context_length=8192)  # unload 2–3 s, load 3–6 s
        copy = engine.copies["m"]
        await engine.close()
        return copy.context_length, copy.footprint_mib

    assert _virtual(main) == (8192, 3000)
    assert log.entries == [("load", "m", 0.0), ("reload", "m", 3.0), ("load", "m", 3.0)]


def test_another_context_waits_for_the_busy_copy_and_holds_up_the_line() -> None:
    log = _Log()

    async def main() -> list[str]:
        engine = _card(log)
        order: list[str] = []
        busy = await engine.acquire("m", 2000, context_length=1024)

        async def then(model: str, mib: int, ctx: int | None) -> None:
            await _use(engine, model, mib, context_length=ctx)
            order.append(f"{model}@{ctx}")

        waiting = [asyncio.ensure_future(then("m", 2000, 4096)),
                   asyncio.ensure_future(then("other", 1000, None))]  # fits, but waits
        await asyncio.sleep(10)
        order.append("released")
        engine.release(busy.copy)
        await asyncio.gather(*waiting)
        await engine.close()
        return order

    assert _virtual(main) == ["released", "m@4096", "other@None"]


def test_each_request_brings_its_own_keep_alive() -> None:
    log = _Log()

    async def main() -> dict[str, str]:
        engine = _card(log)
        await _use(engine, "brief", 1000, keep_alive=10.0)  # ready at 1 s, gone at 12 s
        await _use(engine, "gone-now", 1000, keep_alive=0.0)  # ready at 2 s, gone at 3 s
        await _use(engine, "forever", 1000, keep_alive=math.inf)
        await _use(engine, "default", 1000)  # the card's 300 s
        await asyncio.sleep(10_000)
        resident = {m: c.state.value for m, c in engine.copies.items()}
        await engine.close()
        return resident

    assert _virtual(main) == {"forever": "ready"}
    unloads = [(why, model, at) for why, model, at in log.entries if why != "load"]
    assert unloads == [("unloaded", "gone-now", 3.0), ("expired", "brief", 12.0),
                       ("expired", "default", 305.0)]


def test_a_full_line_refuses_and_a_model_larger_than_the_card_fails() -> None:
    async def main() -> None:
        engine = _card(_Log(), max_queue=1)
        with pytest.raises(ModelExceedsCard, match="needs 9300 MiB, the card has 9216"):
            await engine.acquire("huge", 9300)
        got = await engine.acquire("m", 1000)
        slot = await engine.take_slot(got.copy)
        second = await engine.acquire("m", 1000)
        waiting = asyncio.ensure_future(engine.take_slot(second.copy))  # the line: 1
        await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="1 requests wait"):
            await engine.acquire("m", 1000)
        engine.give_slot(got.copy, slot)
        assert (await waiting).waited is True  # it had to wait for the slot
        await engine.close()

    _virtual(main)


def test_a_caller_that_gives_up_leaves_neither_a_place_in_line_nor_a_slot() -> None:
    async def main() -> tuple[int, int, int]:
        engine = _card(_Log())
        first = await engine.acquire("m", 1000)
        taken = await engine.take_slot(first.copy)
        second = await engine.acquire("m", 1000)
        slot = asyncio.ensure_future(engine.take_slot(second.copy))
        queued = asyncio.ensure_future(engine.acquire("big", 9000))  # needs m gone
        await asyncio.sleep(0)
        engine.give_slot(first.copy, taken)  # handed to the second caller …
        slot.cancel()  # … who gives up before it runs: the slot must come back
        queued.cancel()
        await asyncio.gather(slot, queued, return_exceptions=True)
        engine.release(first.copy)
        engine.release(second.copy)
        copy = engine.copies["m"]
        state = (copy.active, copy.refs, engine.waiting())
        await engine.close()
        return state

    assert _virtual(main) == (0, 0, 0)


@pytest.mark.parametrize(
    ("numbers", "field"),
    [({"reserve_mib": 10240}, "reserve_mib"), ({"reserve_mib": -1}, "reserve_mib"),
     ({"num_parallel": 0}, "num_parallel"), ({"load_rate_mibps": 0.0}, "load_rate_mibps")],
)
def test_impossible_card_numbers_are_refused_by_name(numbers: dict[str, Any],
                                                     field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CardSpec(**{"vram_mib": 10240, **numbers})


def test_a_scaled_clock_shows_emulated_instants_in_wall_time() -> None:
    clock = ScaledClock(0.01)
    start = clock.now()
    assert clock.wall_time(start + 100.0) - clock.wall_time(start) == pytest.approx(1.0)
    still = ScaledClock(0.0)
    assert still.now() == still.now()  # at scale 0 emulated time stands still
    # five minutes ahead of the wall clock at the moment it is asked: bracketed by
    # readings taken around the call, so no margin depends on how busy the machine is
    before = time.time()
    shown = still.wall_time(still.now() + 300.0)
    after = time.time()
    assert before + 300.0 <= shown <= after + 300.0
    with pytest.raises(ValueError, match="time scale"):
        ScaledClock(-1.0)


async def test_at_time_scale_0_a_model_stays_loaded_after_its_call() -> None:
    # Work is instantaneous at scale 0, but no later instant comes, so a keep-alive
    # never runs out (the gateway bench's emulator: every call was a cold load when it did).
    emulator = OllamaEmulator(EmulatorConfig(models=(SMALL,), vram_mib=24576, time_scale=0.0))
    emulator.start()
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            answered = await http.post(f"{emulator.url}/api/chat", json={
                "model": SMALL.name, "stream": False,
                "messages": [{"role": "user", "content": "hi"}]})
            assert answered.status_code == 200
            listed = (await http.get(f"{emulator.url}/api/ps")).json()["models"]
            again = await http.post(f"{emulator.url}/api/generate", json={
                "model": SMALL.name, "prompt": "hi", "stream": False})
            assert again.status_code == 200
        assert [m["name"] for m in listed] == [SMALL.name]
        assert datetime.fromisoformat(listed[0]["expires_at"]).timestamp() > time.time() + 60
        assert emulator.stats()["loads"] == 1  # the second call found it warm
    finally:
        emulator.stop()


async def test_the_emulator_keeps_the_reserve_and_says_so(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator(vram_mib=7000, reserve_mib=1024)  # offers 5976 MiB
    async with httpx.AsyncClient(timeout=10) as http:
        refused = await http.post(f"{emulator.url}/api/generate", json={"model": LARGE.name})
        loaded = await http.post(f"{emulator.url}/api/generate", json={"model": SMALL.name})
        stats = (await http.get(f"{emulator.url}/emulator/stats")).json()
    assert refused.status_code == 500 and "1024 MiB reserve" in refused.json()["error"]
    assert loaded.status_code == 200
    assert (stats["vramMiB"], stats["reserveMiB"], stats["loads"]) == (7000, 1024, 1)


async def test_the_emulator_tells_its_story_in_order(emulator: OllamaEmulator) -> None:
    # what a failing end-to-end test prints: loads, unloads with their reason, requests
    async with httpx.AsyncClient(timeout=10) as http:
        await http.post(f"{emulator.url}/api/generate", json={
            "model": SMALL.name, "prompt": "hi", "stream": False})
        await http.post(f"{emulator.url}/api/generate", json={
            "model": SMALL.name, "keep_alive": 0})
    await emulator.until(lambda engine: f"unloaded {SMALL.name}" in engine.story())
    lines = [line.split(maxsplit=1)[1] for line in emulator.engine.story().splitlines()]
    # the request as received, the load it started, the keep_alive 0 unload
    assert lines == [f"request /api/generate {SMALL.name}", f"load {SMALL.name}",
                     f"unloaded {SMALL.name}"]
