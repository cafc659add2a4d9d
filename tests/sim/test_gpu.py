"""The emulated engine: loads, slots, Ollama's eviction order, and the VRAM invariant."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.sim.gpu import EmulatedGpu, GpuEvents
from kubemoot.sim.vloop import run_virtual

SIZES = {"big": 20480, "mid": 10240, "small": 4096}


class _Log(GpuEvents):
    def __init__(self) -> None:
        self.loads: list[tuple[str, float]] = []
        self.unloads: list[tuple[str, str, float]] = []

    def load_started(self, gpu: str, model: str, mib: int, at: float) -> None:
        self.loads.append((model, at))

    def unloaded(self, gpu: str, model: str, reason: str, at: float) -> None:
        self.unloads.append((model, reason, at))


def _gpu(log: _Log, **kw: float) -> EmulatedGpu:
    args: dict[str, float] = {"vram_mib": 24576, "keep_alive_seconds": 300.0}
    args.update(kw)
    return EmulatedGpu("g", sizes_mib=SIZES, events=log, max_parallel=1,
                       vram_mib=int(args["vram_mib"]),
                       keep_alive_seconds=args["keep_alive_seconds"])


def test_a_cold_call_waits_for_its_load_then_shares_the_slot_in_turn() -> None:
    log = _Log()

    async def main() -> list[float]:
        gpu = _gpu(log)
        starts = await asyncio.gather(gpu.serve("mid", 5.0), gpu.serve("mid", 5.0))
        await gpu.close()
        return sorted(starts)

    # 10 GiB at 1 GiB/s: 10 s of loading; one slot: the second call starts at 15 s.
    assert run_virtual(main()) == [10.0, 15.0]
    assert log.loads == [("mid", 0.0)]


def test_a_full_card_evicts_the_idle_model_whose_keep_alive_ends_first() -> None:
    log = _Log()

    async def main() -> None:
        gpu = _gpu(log, vram_mib=1024 + 20480)
        await gpu.serve("small", 1.0)  # idle from 5 s, expires at 305 s
        await gpu.serve("mid", 1.0)  # idle from 16 s, expires at 316 s
        await gpu.serve("big", 1.0)  # needs both gone: small first, then mid
        await gpu.close()

    run_virtual(main())
    assert [(m, why) for m, why, _ in log.unloads] == [("small", "evicted"), ("mid", "evicted")]


def test_an_idle_model_leaves_after_its_keep_alive() -> None:
    log = _Log()

    async def main() -> None:
        gpu = _gpu(log, keep_alive_seconds=60.0)
        await gpu.serve("small", 2.0)
        await asyncio.sleep(120)
        await gpu.close()

    run_virtual(main())
    # loaded at 4 s, call ends at 6 s, expires at 66 s, unload takes 1 s
    assert log.unloads == [("small", "expired", 67.0)]


def test_unload_is_answered_at_once_and_the_memory_comes_back_later() -> None:
    """As Ollama answers ``keep_alive: 0`` (and the emulator with it): the answer comes
    at once, the copy stops being offered, and its memory is held for the unload's
    second."""
    log = _Log()

    async def main() -> tuple[tuple[int, float, bool], tuple[int, float]]:
        gpu = _gpu(log)
        await gpu.preload("mid")
        await gpu.unload("mid")
        answered = (gpu.engine.used_mib, asyncio.get_running_loop().time(),
                    gpu.is_warm("mid"))
        await asyncio.sleep(5)
        return answered, (gpu.engine.used_mib, asyncio.get_running_loop().time())

    assert run_virtual(main()) == ((SIZES["mid"], 10.0, False), (0, 15.0))
    assert log.unloads == [("mid", "unloaded", 11.0)]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(SIZES)), st.floats(0, 30), st.floats(0.1, 20)),
        min_size=1, max_size=25,
    ),
    st.integers(1, 3),
)
def test_vram_never_exceeds_usable_memory_at_any_event(
    requests: list[tuple[str, float, float]], slots: int
) -> None:
    log = _Log()

    async def main() -> EmulatedGpu:
        gpu = EmulatedGpu("g", vram_mib=24576, sizes_mib=SIZES, max_parallel=slots,
                          keep_alive_seconds=15.0, events=log)

        async def one(model: str, at: float, duration: float) -> None:
            await asyncio.sleep(at)
            await gpu.serve(model, duration)

        await asyncio.gather(*(one(*r) for r in requests))
        await gpu.close()
        return gpu

    gpu = run_virtual(main())  # VramOvercommit would fail the run at the offending event
    assert gpu.engine.vram_checks == len(log.loads) + len(log.unloads)  # every change was checked
    assert gpu.engine.peak_mib <= gpu.usable_mib
