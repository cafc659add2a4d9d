"""Cold loads of a lesser model in the quality band: for overflow only (DESIGN §5's band,
runtime.md "Cold loads: any model in the band")."""

from __future__ import annotations

from typing import Any

from kubemoot.runtime.what_if import PlacementState
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


TIGHT = [{"name": "mistral-small:24b", "vramMiB": 16384}, {"name": "qwen3:14b", "vramMiB": 12288},
         {"name": "qwen2.5-coder:14b", "vramMiB": 11264}]
TIGHT_BAND = (("mistral-small:24b", 75), ("qwen3:14b", 68))


def _coder_on_both() -> PlacementState:
    # Two 24 GiB cards (23 GiB usable), each with an idle coder copy (11 GiB): the 24b
    # fits nowhere without an eviction, the 14b fits beside the coder on either card.
    return state([
        {"name": "a", "totalVramMiB": 24576,
         "residents": [{"model": "qwen2.5-coder:14b", "sizeMiB": 11264}]},
        {"name": "b", "totalVramMiB": 24576,
         "residents": [{"model": "qwen2.5-coder:14b", "sizeMiB": 11264}]},
    ], models=TIGHT)


async def test_a_band_model_that_fits_beats_evicting_for_the_preferred_one() -> None:
    out = await place(_coder_on_both(), *TIGHT_BAND)
    # The 24b only comes by unloading a coder: 16 s + 1 s; the 14b loads onto free room
    # in 12 s and evicts nothing, and it keeps the band's promise.
    assert (out["action"], out["model"]) == ("cold-load", "qwen3:14b")
    prices = {(o[0], o[2]): o[3] for o in options(out)}
    assert prices[("unload", "mistral-small:24b")] == 17.0
    assert round(prices[("cold-load", "qwen3:14b")]) == 12


async def test_the_preferred_model_still_evicts_when_that_is_cheaper() -> None:
    # The same cards with one slot each, and three agents planning 14b calls: a 14b copy
    # would crowd (3 calls beyond its slot, 30 s each), so evicting for the 24b wins.
    doc = _coder_on_both().model_dump(by_alias=True, mode="json")
    providers = [{**p, "maxParallel": 1} for p in doc["providers"]]
    out = await place(state(providers, models=TIGHT, demand={"qwen3:14b": {"intents": 3}}),
                      *TIGHT_BAND)
    assert (out["action"], out["model"]) == ("unload", "mistral-small:24b")


GEMMA = [{"name": "gemma3:27b", "vramMiB": 20480}, {"name": "gemma3:12b", "vramMiB": 10240},
         {"name": "other", "vramMiB": 12288}]
GEMMA_BAND = (("gemma3:27b", 80), ("gemma3:12b", 72))


def _gemma_busy(demand: dict[str, Any]) -> PlacementState:
    # The 27b's one copy has both slots busy for about 29 s more; card b (16 GiB) can
    # never hold the 27b, and holds an idle "other" that leaves no room for the 12b.
    return state([
        {"name": "a", "totalVramMiB": 24576, "maxParallel": 2,
         "residents": [{"model": "gemma3:27b", "sizeMiB": 20480}],
         "tickets": [{"model": "gemma3:27b", "startedAt": ago(1), "footprintMiB": 0},
                     {"model": "gemma3:27b", "startedAt": ago(1), "footprintMiB": 0}]},
        {"name": "b", "totalVramMiB": 16384,
         "residents": [{"model": "other", "sizeMiB": 12288}]},
    ], models=GEMMA, demand=demand)


async def test_overflow_may_evict_an_unwanted_model_for_a_band_model() -> None:
    out = await place(_gemma_busy({}), *GEMMA_BAND)
    # queue at a: 29 s; unload "other" on b and load the 12b: 1 + 10 = 11 s
    assert (out["action"], out["provider"], out["model"]) == ("unload", "b", "gemma3:12b")


async def test_nothing_planned_for_is_evicted_for_a_band_model() -> None:
    out = await place(_gemma_busy({"other": {"intents": 1}}), *GEMMA_BAND)
    assert (out["action"], out["provider"], out["model"]) == ("queue", "a", "gemma3:27b")
