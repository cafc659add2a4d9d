"""Cold loads of a lesser model in the quality band: for overflow only (DESIGN §5's band,
runtime.md "Cold loads: any model in the band")."""

from __future__ import annotations

from tests.runtime.test_tie_order_and_loading_copies import ago, options, place, state

MODELS = [{"name": "qwen3:32b", "vramMiB": 27648}, {"name": "qwen3:14b", "vramMiB": 12288}]
BAND = (("qwen3:32b", 70), ("qwen3:14b", 60))


async def test_the_preferred_model_s_first_copy_is_never_skipped_for_a_faster_load() -> None:
    out = await place(state([
        {"name": "a", "totalVramMiB": 32768},
        {"name": "b", "totalVramMiB": 32768},
    ], models=MODELS), *BAND)
    # 14b would load in 12 s against 27 s, yet nobody has the preferred model yet
    assert (out["action"], out["model"]) == ("cold-load", "qwen3:32b")
    assert {o[2] for o in options(out)} == {"qwen3:32b"}


async def test_overflow_of_the_preferred_model_loads_a_band_model_beside_it() -> None:
    out = await place(state([
        {"name": "a", "totalVramMiB": 32768, "maxParallel": 1, "latencySeconds": 20,
         "residents": [{"model": "qwen3:32b", "sizeMiB": 27648}],
         "tickets": [{"model": "qwen3:32b", "startedAt": ago(5), "footprintMiB": 0}]},
        {"name": "b", "totalVramMiB": 32768},
    ], models=MODELS), *BAND)
    # queue at a: 15 s left of its call; 14b on b: 12 s; a second 32b on b: 27 s
    assert (out["action"], out["provider"], out["model"]) == ("cold-load", "b", "qwen3:14b")
    prices = {(o[0], o[2]): o[3] for o in options(out)}
    assert prices[("queue", "qwen3:32b")] == 15.0
    assert round(prices[("cold-load", "qwen3:32b")]) == 27
