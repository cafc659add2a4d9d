"""The HTTP emulator and the simulator's GPU run one engine model, so they agree.

The same requests go once through the official ``ollama`` client (inside
:class:`~kubemoot.providers.ollama.OllamaProvider`) to a real emulator server and once
to the simulator's :class:`~kubemoot.sim.gpu.EmulatedGpu` in virtual time. Both cards
must load, evict and queue in the same order: the reserve is kept, loads happen one at
a time, an unloading model holds its memory until it is gone, idle models go one at a
time (soonest keep-alive end first) and a request whose model cannot be placed holds
up the ones behind it. They must also agree on what a context costs and does: the KV
slab grows the footprint, another ``num_ctx`` reloads the copy, an over-long prompt is
cut silently, and a slot's cached prefix spares a thread's next call its prefill.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubemoot.emulation.card import EmulatorEngine
from kubemoot.emulation.engine import (
    CopyState,
    EngineEvents,
    ModelSize,
    OllamaEngine,
    UnloadReason,
)
from kubemoot.emulation.server import EmulatedModel, EmulatorConfig, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.protocol import ProviderClient
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.vloop import run_virtual

SIZES = {"a:1b": 3000, "b:1b": 3000, "c:1b": 2000, "d:1b": 5000, "e:1b": 7000}
VRAM, RESERVE = 8192, 1024  # the card offers 7168 MiB
KEEP_ALIVE = 30_000.0
# A call lasts about as long as its prompt (the emulator takes PER_PROMPT_TOKEN seconds a
# token); the simulator is told the same length. The long one gives the line time to form.
PER_PROMPT_TOKEN = 0.5
HI = [{"role": "user", "content": "hi"}]  # 5 tokens: about 2.5 s
LONG = [{"role": "user", "content": "x" * 4000}]  # 1004 tokens: about 500 s
SHORT_CALL = {"simDurationSeconds": 2.5}  # the simulator's call lengths; HTTP ignores them
LONG_CALL = {"simDurationSeconds": 500.0}

Snapshot = tuple[str, str, int, tuple[tuple[str, str], ...]]


class _Log(EngineEvents):
    """Each load and unload with the card's memory and copies right after it."""

    def __init__(self, engine: OllamaEngine) -> None:
        self._engine = engine
        self.entries: list[Snapshot] = []
        engine.observe(self)

    def _card(self, event: str, model: str) -> None:
        copies = tuple(sorted((c.model, c.state.value) for c in self._engine.copies.values()))
        self.entries.append((event, model, self._engine.used_mib, copies))

    def load_started(self, model: str, mib: int, at: float) -> None:
        self._card("load", model)

    def unloaded(self, model: str, reason: UnloadReason, at: float) -> None:
        self._card(reason.value, model)


@dataclass
class _Side:
    client: ProviderClient
    engine: OllamaEngine
    until: Callable[[Callable[[OllamaEngine], bool]], Awaitable[None]]


async def _requests(side: _Side) -> None:
    """The one sequence both cards receive."""
    client = side.client
    await client.preload("a:1b")
    await client.preload("b:1b")
    await client.chat("a:1b", HI, options=SHORT_CALL)  # a used last: b's keep-alive ends first
    await client.preload("c:1b")  # fits 8192 − 6000 but not the 7168 offered: b goes
    await client.preload("d:1b")  # a goes, and that is enough
    await client.preload("e:1b")  # c, then d: one at a time
    # Head of line: e is busy; a needs e's memory and waits; a second call for the warm
    # e waits behind a, in the card's one line, instead of taking e's slot next.
    first = asyncio.ensure_future(client.chat("e:1b", LONG, options=LONG_CALL))
    await side.until(lambda engine: engine.copies["e:1b"].active == 1)
    load_a = asyncio.ensure_future(client.preload("a:1b"))
    await side.until(lambda engine: engine.waiting() == 1)
    second = asyncio.ensure_future(client.chat("e:1b", HI, options=SHORT_CALL))
    await side.until(lambda engine: engine.waiting() == 2)
    await asyncio.gather(first, load_a, second)


def _through_http() -> list[Snapshot]:
    config = EmulatorConfig(
        models=tuple(EmulatedModel(name, mib) for name, mib in SIZES.items()),
        vram_mib=VRAM, reserve_mib=RESERVE, num_parallel=1, load_rate_mibps=1000.0,
        unload_seconds=1.0, base_latency_s=0.0, per_token_s=0.0,
        prompt_per_token_s=PER_PROMPT_TOKEN,
        keep_alive_s=KEEP_ALIVE, time_scale=0.005)

    async def main(emulator: OllamaEmulator) -> list[Snapshot]:
        log = _Log(emulator.engine.card)

        async def until(predicate: Callable[[OllamaEngine], bool]) -> None:
            await emulator.until(lambda engine: predicate(engine.card))

        async with OllamaProvider("emu", emulator.url, timeout=60) as client:
            await _requests(_Side(client, emulator.engine.card, until))
        return log.entries

    with OllamaEmulator(config) as emulator:
        return asyncio.run(main(emulator))


def _in_the_simulator() -> list[Snapshot]:
    async def main() -> list[Snapshot]:
        gpu = EmulatedGpu("g", vram_mib=VRAM, reserve_mib=RESERVE, sizes_mib=SIZES,
                          max_parallel=1, load_rate_mibps=1000.0, unload_seconds=1.0,
                          keep_alive_seconds=KEEP_ALIVE)
        log = _Log(gpu.engine)
        changed = asyncio.Event()
        gpu.engine.on_change(changed.set)

        async def until(predicate: Callable[[OllamaEngine], bool]) -> None:
            while not predicate(gpu.engine):
                changed.clear()
                await changed.wait()

        await _requests(_Side(gpu, gpu.engine, until))
        await gpu.close()
        return log.entries

    return run_virtual(main())


def test_the_emulator_and_the_simulator_load_evict_and_queue_alike() -> None:
    simulated = _in_the_simulator()
    assert _through_http() == simulated
    assert [(event, model) for event, model, _, _ in simulated] == [
        ("load", "a:1b"), ("load", "b:1b"),
        ("evicted", "b:1b"), ("load", "c:1b"),
        ("evicted", "a:1b"), ("load", "d:1b"),
        ("evicted", "c:1b"), ("evicted", "d:1b"), ("load", "e:1b"),
        ("evicted", "e:1b"), ("load", "a:1b"),  # a went first: it was ahead in line
        ("evicted", "a:1b"), ("load", "e:1b"),
    ]
    for event, model, used, copies in simulated:
        assert used <= VRAM - RESERVE  # the reserve is never lent out
        if event == "load":  # one load at a time, and never into memory still unloading
            others = [state for name, state in copies if name != model]
            assert CopyState.LOADING not in others and CopyState.UNLOADING not in others


# -- context, truncation and the prompt-prefix cache ------------------------------------

KV_MODEL = "k:1b"
KV_SIZE = ModelSize(1000, kv_mib_per_1k_tokens=64.0)
CONTEXT = 1024  # the card's default; 2 slots: 1000 + 64 × 1024 × 2 / 1024 = 1128 MiB


def _turn(role: str, fill: str, chars: int) -> dict[str, str]:
    return {"role": role, "content": fill * chars}  # chars / 4 + 4 tokens


A1, R1, A2 = _turn("user", "a", 396), _turn("assistant", "b", 96), _turn("user", "c", 196)
R2, A3 = _turn("assistant", "e", 96), _turn("user", "f", 196)
B1 = _turn("user", "d", 396)
#: (messages, num_ctx): the calls both cards receive, one after another
CALLS: list[tuple[list[dict[str, str]], int | None]] = [
    ([A1], None),  # 103 tokens, cold: slot 0
    ([A1, R1, A2], None),  # 103 + 28 + 53 = 184, slot 0 holds A1: 103 cached
    ([B1], None),  # another thread: slot 1, unused longest
    ([A1, R1, A2, R2, A3], None),  # 265, back to slot 0: 184 cached
    ([A1], 4096),  # another context: reload at 1000 + 64 × 4 × 2 = 1512 MiB, caches gone
    ([_turn("user", "g", 20000)], 4096),  # 5004 tokens: cut to 4096
]
#: (cached, evaluated, truncated) per call, by hand from the token counts above
EXPECTED = [(0, 103, False), (103, 184, False), (0, 103, False), (184, 265, False),
            (0, 103, False), (0, 4096, True)]

Seen = tuple[list[tuple[int, int, bool]], list[Snapshot]]


def _cache_through_http() -> Seen:
    config = EmulatorConfig(
        models=(EmulatedModel(KV_MODEL, KV_SIZE.weights_mib,
                              kv_mib_per_1k_tokens=KV_SIZE.kv_mib_per_1k_tokens),),
        vram_mib=VRAM, reserve_mib=RESERVE, num_parallel=2, context_length=CONTEXT,
        load_rate_mibps=1000.0, unload_seconds=1.0, base_latency_s=0.0, per_token_s=0.0,
        prompt_per_token_s=0.001, keep_alive_s=KEEP_ALIVE, time_scale=0.001)

    async def main(emulator: OllamaEmulator) -> Seen:
        log = _Log(emulator.engine.card)
        seen = []
        async with OllamaProvider("emu", emulator.url, timeout=60) as client:
            for messages, num_ctx in CALLS:
                reply = await client.chat(KV_MODEL, messages, num_ctx=num_ctx)
                record = emulator.records[-1]
                assert reply.prompt_eval_count == record.prompt_tokens_evaluated
                seen.append((record.cached_tokens, record.prompt_tokens_evaluated,
                             record.truncated))
        return seen, log.entries

    with OllamaEmulator(config) as emulator:
        return asyncio.run(main(emulator))


def _cache_in_the_simulator() -> Seen:
    # the simulator is told the prompt the emulator's tokenizer sees in each request
    tokenizer = EmulatorEngine(EmulatorConfig(time_scale=0.0))

    async def main() -> Seen:
        gpu = EmulatedGpu("g", vram_mib=VRAM, reserve_mib=RESERVE,
                          sizes_mib={KV_MODEL: KV_SIZE}, max_parallel=2,
                          context_length=CONTEXT, load_rate_mibps=1000.0,
                          unload_seconds=1.0, keep_alive_seconds=KEEP_ALIVE,
                          prefill_seconds_per_token=0.001)
        log = _Log(gpu.engine)
        seen = []
        for messages, num_ctx in CALLS:
            served = await gpu.serve_prompt(KV_MODEL, 0.0, num_ctx=num_ctx,
                                            prompt=tokenizer.prompt(messages, []))
            seen.append((served.cached_tokens, served.prompt_tokens, served.truncated))
        await gpu.close()
        return seen, log.entries

    return run_virtual(main())


def test_the_emulator_and_the_simulator_agree_on_context_truncation_and_cached_prefixes(
) -> None:
    simulated = _cache_in_the_simulator()
    assert _cache_through_http() == simulated
    calls, events = simulated
    assert calls == EXPECTED
    assert [(event, model, used) for event, model, used, _ in events] == [
        ("load", KV_MODEL, 1128),  # the KV slab for 1024 tokens × 2 slots
        ("reload", KV_MODEL, 0),  # num_ctx 4096: unloaded, then loaded bigger
        ("load", KV_MODEL, 1512),
    ]


# -- unloads --------------------------------------------------------------------------

SLOW_UNLOAD = 600.0  # emulated seconds: 3 real ones at the emulator's time scale


async def _unload_seen(client: ProviderClient, engine: OllamaEngine,
                       until: Callable[[Callable[[OllamaEngine], bool]], Awaitable[None]],
                       ) -> list[tuple[str | None, int, list[str]]]:
    """The card right after the unload's answer, and once the memory is back."""
    await client.preload("a:1b")
    await client.unload("a:1b")
    seen = []
    for _ in range(2):
        copy = engine.copies.get("a:1b")
        listed = [m.name for m in (await client.probe()).loaded_models]
        seen.append((None if copy is None else copy.state.value, engine.used_mib, listed))
        await until(lambda card: not card.copies)
    return seen


def test_an_unload_is_answered_at_once_by_both_cards_and_holds_its_memory_meanwhile(
) -> None:
    config = EmulatorConfig(
        models=(EmulatedModel("a:1b", SIZES["a:1b"]),), vram_mib=VRAM, reserve_mib=RESERVE,
        load_rate_mibps=1000.0, unload_seconds=SLOW_UNLOAD, keep_alive_s=KEEP_ALIVE,
        time_scale=0.005)

    async def over_http(emulator: OllamaEmulator) -> list[tuple[str | None, int, list[str]]]:
        async def until(predicate: Callable[[OllamaEngine], bool]) -> None:
            await emulator.until(lambda engine: predicate(engine.card))

        async with OllamaProvider("emu", emulator.url, timeout=60) as client:
            return await _unload_seen(client, emulator.engine.card, until)

    async def simulated() -> list[tuple[str | None, int, list[str]]]:
        gpu = EmulatedGpu("g", vram_mib=VRAM, reserve_mib=RESERVE, sizes_mib=SIZES,
                          load_rate_mibps=1000.0, unload_seconds=SLOW_UNLOAD,
                          keep_alive_seconds=KEEP_ALIVE)
        changed = asyncio.Event()
        gpu.engine.on_change(changed.set)

        async def until(predicate: Callable[[OllamaEngine], bool]) -> None:
            while not predicate(gpu.engine):
                changed.clear()
                await changed.wait()

        try:
            return await _unload_seen(gpu, gpu.engine, until)
        finally:
            await gpu.close()

    in_the_simulator = run_virtual(simulated())
    with OllamaEmulator(config) as emulator:
        assert asyncio.run(over_http(emulator)) == in_the_simulator
    assert in_the_simulator == [("unloading", SIZES["a:1b"], []), (None, 0, [])]
