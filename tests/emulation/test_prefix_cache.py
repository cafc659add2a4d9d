"""Prefill and the per-slot prompt-prefix cache of the engine model, in virtual time.

Every number is checkable by hand: prefill costs 0.001 s a token, so a prompt of 1000
uncached tokens takes 1 s before its first token, and a thread's next call on the slot
that served it pays only for what it added.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from kubemoot.clock import LoopClock
from kubemoot.emulation.engine import CardSpec, ModelSize, OllamaEngine, SlotGrant
from kubemoot.emulation.prompt import Prompt, PromptBlock
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.vloop import run_virtual

T = TypeVar("T")
PER_TOKEN = 0.001


def _virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_virtual(main())


def _card(*, parallel: int = 1) -> OllamaEngine:
    return OllamaEngine("card", CardSpec(vram_mib=10240, reserve_mib=1024,
                                         num_parallel=parallel, load_rate_mibps=1000.0,
                                         unload_seconds=1.0,
                                         prefill_seconds_per_token=PER_TOKEN),
                        clock=LoopClock(epoch=0.0, anchor=0.0))


async def _call(engine: OllamaEngine, prompt: Prompt, *, model: str = "m") -> SlotGrant:
    got = await engine.acquire(model, 1000)
    grant = await engine.take_slot(got.copy, prompt)
    await engine.clock.sleep(engine.prefill_seconds(grant))
    engine.give_slot(got.copy, grant)
    engine.release(got.copy)
    return grant


# -- the prompt's identity ------------------------------------------------------------

def test_two_calls_of_a_thread_share_every_turn_the_shorter_one_holds() -> None:
    first = Prompt.thread("t1", [800, 200], system=100)
    later = Prompt.thread("t1", [800, 200, 300, 50], system=100)
    assert (first.tokens, later.tokens) == (1100, 1450)
    assert later.shared_prefix(first) == first.shared_prefix(later) == 1100
    assert later.shared_prefix(Prompt.thread("t2", [800, 200], system=100)) == 0
    assert later.shared_prefix(None) == 0


def test_a_changed_block_ends_the_shared_prefix() -> None:
    sent = Prompt.of(("sys", 100), ("q1", 400), ("a1", 50))
    assert sent.shared_prefix(Prompt.of(("sys", 100), ("q1*", 400), ("a1", 50))) == 100
    assert sent.shared_prefix(Prompt.of(("sys", 100), ("q1", 399))) == 100


@pytest.mark.parametrize(
    ("context", "kept", "tokens", "same_start"),
    [(None, (0, 1, 2, 3), 1000, True),  # no limit
     (1000, (0, 1, 2, 3), 1000, True),  # exactly fits
     (700, (0, 2, 3), 600, False),  # the oldest unpinned block goes: 1000 − 400
     (250, (0, 3), 250, False)],  # all droppable gone (400 + 300 left), then cut to 250
)
def test_the_engine_cuts_an_over_long_prompt_silently(
        context: int | None, kept: tuple[int, ...], tokens: int, same_start: bool) -> None:
    prompt = Prompt((PromptBlock("sys", 100, pinned=True), PromptBlock("q1", 400),
                     PromptBlock("a1", 200), PromptBlock("q2", 300)))
    fitted = prompt.fit(context)
    assert (fitted.kept, fitted.tokens, fitted.tokens_sent) == (kept, tokens, 1000)
    assert fitted.truncated == (tokens < 1000)
    assert fitted.prompt.tokens == tokens
    # what is evaluated after a cut no longer starts as the prompt sent did beyond the
    # pinned part, so a slot holding the whole prompt would share at most that part
    assert (fitted.prompt.shared_prefix(prompt) == tokens) == same_start


# -- one slot ------------------------------------------------------------------------------

def test_a_thread_pays_only_for_what_it_added_until_another_thread_takes_its_slot() -> None:
    async def main() -> list[tuple[int, int, float]]:
        engine = _card()
        seen = []
        for prompt in (Prompt.thread("a", [1000]),  # cold: 1000 tokens, 1 s
                       Prompt.thread("a", [1000, 500]),  # 1000 cached: 0.5 s
                       Prompt.thread("b", [300]),  # another thread overwrites the slot
                       Prompt.thread("a", [1000, 500, 100])):  # a lost its prefix: 1.6 s
            began = engine.clock.now()
            grant = await _call(engine, prompt)
            seen.append((grant.cached_tokens, grant.uncached_tokens,
                         round(engine.clock.now() - began, 6)))
        await engine.close()
        return seen

    # the first call also waits 1 s for the load
    assert _virtual(main) == [(0, 1000, 2.0), (1000, 500, 0.5), (0, 300, 0.3),
                              (0, 1600, 1.6)]


def test_the_cache_goes_with_the_copy() -> None:
    async def main() -> tuple[tuple[Prompt | None, ...], int, tuple[Prompt | None, ...]]:
        engine = _card()
        prompt = Prompt.thread("a", [1000])
        await _call(engine, prompt)
        held = engine.cached_prompts("m")
        gone = engine.unload("m")
        assert gone is not None
        await gone.wait()
        after = engine.cached_prompts("m")
        again = await _call(engine, Prompt.thread("a", [1000, 10]))
        await engine.close()
        return held, again.cached_tokens, after

    held, cached, after = _virtual(main)
    assert held == (Prompt.thread("a", [1000]),)
    assert (cached, after) == (0, ())


# -- several slots --------------------------------------------------------------------------

def test_a_request_takes_the_free_slot_holding_its_thread_else_the_one_unused_longest() -> None:
    async def main() -> list[tuple[int, int]]:
        engine = _card(parallel=2)
        slots = []
        for prompt in (Prompt.thread("a", [400]),  # slot 0 (both empty: the lower)
                       Prompt.thread("b", [400]),  # slot 1: unused longer than 0
                       Prompt.thread("a", [400, 40]),  # back to slot 0: 400 cached
                       Prompt.thread("c", [400]),  # slot 1, unused longest: b is lost
                       Prompt.thread("b", [400, 40])):  # slot 0, unused longest: a lost
            grant = await _call(engine, prompt)
            slots.append((grant.index, grant.cached_tokens))
        assert engine.cached_tokens("m", Prompt.thread("c", [400, 8])) == 400
        assert engine.cached_tokens("m", Prompt.thread("a", [400, 40, 8])) == 0
        await engine.close()
        return slots

    assert _virtual(main) == [(0, 0), (1, 0), (0, 400), (1, 0), (0, 0)]


def test_a_waiting_request_gets_the_slot_given_back_and_its_cache() -> None:
    async def main() -> tuple[SlotGrant, SlotGrant]:
        engine = _card()
        got = await engine.acquire("m", 1000)
        first = await engine.take_slot(got.copy, Prompt.thread("a", [1000]))
        second_got = await engine.acquire("m", 1000)
        waiting = asyncio.ensure_future(
            engine.take_slot(second_got.copy, Prompt.thread("a", [1000, 20])))
        await asyncio.sleep(1)
        engine.give_slot(got.copy, first)
        second = await waiting
        engine.give_slot(second_got.copy, second)
        engine.release(got.copy)
        engine.release(second_got.copy)
        await engine.close()
        return first, second

    first, second = _virtual(main)
    assert (first.waited, second.waited) == (False, True)
    assert (second.index, second.cached_tokens, second.uncached_tokens) == (0, 1000, 20)


# -- the simulator's card -------------------------------------------------------------------

def test_the_simulated_gpu_counts_prefill_and_the_cut_in_its_call() -> None:
    async def main() -> list[tuple[float, float, int, int, bool]]:
        gpu = EmulatedGpu("g", vram_mib=10240, reserve_mib=1024,
                          sizes_mib={"m": ModelSize(1000, kv_mib_per_1k_tokens=64.0)},
                          load_rate_mibps=1000.0, prefill_seconds_per_token=PER_TOKEN,
                          context_length=2048)
        seen = []
        for prompt in (Prompt.thread("a", [1500]), Prompt.thread("a", [1500, 400]),
                       Prompt.thread("a", [1500, 400, 600])):
            served = await gpu.serve_prompt("m", 2.0, prompt=prompt)
            seen.append((served.started, served.prefill_seconds, served.cached_tokens,
                         served.prompt_tokens, served.truncated))
        assert gpu.engine.truncations == 1
        # footprint: 1000 MiB of weights + 64 MiB per 1k tokens of 2048 × 1 slot
        assert gpu.engine.copies["m"].footprint_mib == 1128
        await gpu.close()
        return seen

    assert [(round(s, 6), round(p, 6), c, t, cut) for s, p, c, t, cut in _virtual(main)] == [
        (1.128, 1.5, 0, 1500, False),  # loaded 1128 MiB at 1000 MiB/s first
        (4.628, 0.4, 1500, 1900, False),  # after 1.5 + 2 s: only the 400 new tokens
        # 2500 tokens do not fit 2048: turn 0 goes, 1000 are left and they start with
        # turn 1, so the slot (turn 0, turn 1) shares nothing with them
        (7.028, 1.0, 0, 1000, True),
    ]
