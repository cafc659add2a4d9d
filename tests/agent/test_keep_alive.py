"""An agent's chat asks the engine for the runtime's keep-alive.

The gateway and the simulator already ask for ``engine_keep_alive_seconds``; an agent
that did not left each copy to the engine's own default (five minutes in Ollama), after
which the engine unloads a model the runtime still counts on for warm calls.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import ollama

from kubemoot.agent.wiring import build_stack
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.memory import MemoryKV
from tests.agent.conftest import TINY, ollama_factory

ENGINE_DEFAULT_S = 300.0  # what the card keeps a model for when a request names no keep_alive


async def _expiry_after_one_call(make_emulator: Callable[..., OllamaEmulator],
                                 keep_alive: float) -> float:
    """Seconds from now until the engine drops the copy the agent's call used."""
    clock = SystemClock()
    kv = MemoryKV(clock=clock)
    emulator = make_emulator(time_scale=1.0, base_latency_s=0.0, keep_alive_s=ENGINE_DEFAULT_S)
    client = OllamaProvider("gpu-a", emulator.url, context_length=1024, num_parallel=2,
                            total_vram_mib=8192, reserve_mib=512)
    settings = RuntimeSettings().with_values({
        "load_rate_mibps": 1e6, "unload_seconds": 0.001, "default_latency_seconds": 0.05,
        "engine_keep_alive_seconds": keep_alive,
    })
    try:
        states = await kv.bucket(PROVIDER_STATE_BUCKET)
        await Prober([client], clock=clock, publish=publish_to_kv(states)).probe_all()
        stack = await build_stack(kv, clients={"gpu-a": client}, client_factory=ollama_factory,
                                  clock=clock, settings=settings, declared={TINY.name: 1000})
        try:
            outcome = await stack.agents.call(
                agent="crew/coordinator", thread_id="t1", phase="synthesis",
                messages=[{"role": "user", "content": "hello"}],
                candidates=[CandidateModel(TINY.name, 50.0)], wait=True)
        finally:
            await stack.close()
        assert outcome.refusal is None, outcome
        (copy,) = (await ollama.AsyncClient(host=emulator.url).ps()).models
        assert copy.expires_at is not None
        return (copy.expires_at - datetime.now(UTC)).total_seconds()
    finally:
        await client.close()
        await kv.close()


async def test_an_agent_call_asks_the_engine_for_the_runtime_keep_alive(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    left = await _expiry_after_one_call(make_emulator, keep_alive=1800.0)
    assert ENGINE_DEFAULT_S + 60 < left <= 1800.0


async def test_a_shorter_runtime_keep_alive_reaches_the_engine_too(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    left = await _expiry_after_one_call(make_emulator, keep_alive=120.0)
    assert 0 < left <= 120.0
