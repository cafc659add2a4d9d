"""What /api/ps shows changes when a copy's keep-alive is renewed, not only when copies
come and go: a state document written from it (the simulator's publisher) must carry the
renewed end, or a reader judging residency by it sees a copy in use as lapsed."""

from __future__ import annotations

from kubemoot.clock import LoopClock
from kubemoot.emulation.engine import CardSpec, OllamaEngine
from kubemoot.sim.vloop import run_virtual


def _engine() -> OllamaEngine:
    return OllamaEngine("card", CardSpec(vram_mib=10240, reserve_mib=1024, num_parallel=1,
                                         load_rate_mibps=1000.0, unload_seconds=1.0),
                        clock=LoopClock(epoch=0.0, anchor=0.0))


def test_a_renewed_keep_alive_is_a_change_of_what_api_ps_shows() -> None:
    async def main() -> list[float]:
        engine = _engine()
        ends: list[float] = []
        engine.on_residency_change(
            lambda: ends.extend(c.expires_at for c in engine.copies.values()
                                if c.state == "ready" and c.refs == 0))
        for _ in range(2):  # the same copy used twice, 100 s apart
            got = await engine.acquire("m", 1000, keep_alive=300.0)
            engine.release(got.copy)
            await engine.clock.sleep(100.0)
        return ends

    ends = run_virtual(main())
    # each time the copy turns idle its end moves on, and listeners hear of it
    assert len(set(ends)) >= 2 and max(ends) - min(ends) >= 100.0, ends
