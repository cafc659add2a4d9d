"""A copy whose keep-alive has run out is not an eviction when a load takes its room.

Under a busy machine the emulator's expiry timer can fire late. A load that arrives in
between finds the lapsed copy still resident; the engine unloads it because it is due,
and its stats must not book that as an eviction, which they present as proof that a
scheduler overcommitted the card. A copy still kept alive stays an eviction."""

from __future__ import annotations

from kubemoot.clock import LoopClock
from kubemoot.emulation.engine import CardSpec, EngineEvents, OllamaEngine, UnloadReason
from kubemoot.sim.vloop import run_virtual


class _Heard(EngineEvents):
    def __init__(self) -> None:
        self.unloads: list[tuple[str, UnloadReason]] = []

    def unloaded(self, model: str, reason: UnloadReason, at: float) -> None:
        self.unloads.append((model, reason))


def _room_for_one() -> tuple[OllamaEngine, _Heard]:
    # 9 GiB usable: two 6,000 MiB models never fit together
    heard = _Heard()
    engine = OllamaEngine("card", CardSpec(vram_mib=10240, reserve_mib=1024, num_parallel=1,
                                           load_rate_mibps=1000.0, unload_seconds=1.0),
                          clock=LoopClock(epoch=0.0, anchor=0.0), events=heard)
    return engine, heard


def _second_load_after(lapsed: bool) -> list[tuple[str, UnloadReason]]:
    async def main() -> list[tuple[str, UnloadReason]]:
        engine, heard = _room_for_one()
        got = await engine.acquire("a", 6000, keep_alive=300.0)
        engine.release(got.copy)
        await engine.clock.sleep(10.0)
        if lapsed:  # its keep-alive ran out, and the timer that unloads it is late
            engine.copies["a"].expires_at = engine.clock.now() - 1.0
        other = await engine.acquire("b", 6000, keep_alive=300.0)
        engine.release(other.copy)
        return heard.unloads

    return run_virtual(main())


def test_a_lapsed_copy_that_makes_room_is_an_expiry() -> None:
    assert _second_load_after(lapsed=True) == [("a", UnloadReason.EXPIRED)]


def test_a_copy_still_kept_alive_that_makes_room_is_an_eviction() -> None:
    assert _second_load_after(lapsed=False) == [("a", UnloadReason.EVICTED)]
