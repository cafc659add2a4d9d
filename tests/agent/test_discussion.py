"""The discussion engine through the real runtime, on MemoryKV and emulated GPUs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from kubemoot.agent.answers import GPU_BUSY_TEXT, PROMPT_TOO_LARGE_TEXT
from kubemoot.agent.discussion import AgentProfile, Coordinator, Settlement, Thread
from kubemoot.agent.pool import CallSettings
from kubemoot.agent.signals import ListSink, SignalType
from kubemoot.agent.wiring import RuntimeStack, build_stack
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.providers.protocol import ProviderClient
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, TicketState
from kubemoot.store.memory import MemoryKV

SMALL = EmulatedModel("small:1b", 2000)
BIG = EmulatedModel("big:8b", 6000)
HUGE = "huge:1t"  # declared only: no card can hold it
DECLARED = {"small:1b": 2000, "big:8b": 6000, HUGE: 1_000_000}
FAST = RuntimeSettings().with_values({
    "load_rate_mibps": 1e6, "unload_seconds": 0.001, "default_latency_seconds": 0.05,
})


@asynccontextmanager
async def crew_stack(emulators: Mapping[str, OllamaEmulator]) -> AsyncIterator[RuntimeStack]:
    clock = SystemClock()
    kv = MemoryKV(clock=clock)
    clients: dict[str, ProviderClient] = {
        name: OllamaProvider(name, e.url, context_length=e.config.context_length,
                             num_parallel=e.config.num_parallel,
                             total_vram_mib=e.config.vram_mib, reserve_mib=512)
        for name, e in emulators.items()
    }
    prober = Prober(list(clients.values()), clock=clock,
                    publish=publish_to_kv(await kv.bucket(PROVIDER_STATE_BUCKET)))
    await prober.probe_all()

    async def after_call(provider: str) -> None:
        await prober.probe_one(clients[provider])

    def factory(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
        return OllamaProvider(provider, endpoint, timeout=settings.timeout)

    stack = await build_stack(kv, clients=clients, client_factory=factory, clock=clock,
                              settings=FAST, declared=DECLARED, after_call=after_call)
    try:
        yield stack
    finally:
        await stack.close()
        for client in clients.values():
            await client.close()
        await kv.close()


def _member(name: str, *models: str) -> AgentProfile:
    return AgentProfile(id=f"crew/{name}", role="tooler",
                        mulling=tuple(CandidateModel(m, 50.0) for m in models))


COORDINATOR = AgentProfile(id="crew/coordinator", role="coordinator",
                           mulling=(CandidateModel("small:1b", 70.0),))


async def test_positions_carry_the_provider_and_model_the_call_ran_on(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(models=(SMALL, BIG), vram_mib=16384)}
    async with crew_stack(gpus) as stack:
        sink = ListSink()
        coordinator = Coordinator(stack.agents, COORDINATOR, sink=sink, deadline_seconds=10)
        result = await coordinator.discuss(
            Thread("t1", "is the cluster healthy?"), [_member("a", "big:8b")]
        )
    assert result.settlement is Settlement.SYNTHESIS and result.answered
    (position,) = result.positions()
    assert position.metadata.provider == "gpu-a"
    assert position.metadata.model == "big:8b"
    assert {r.model for r in gpus["gpu-a"].records} == {"big:8b", "small:1b"}
    phases = [(r.agent, r.phase, r.provider) for r in stack.agents.records]
    assert ("crew/a", "mulling", "gpu-a") in phases
    assert ("crew/coordinator", "synthesis", "gpu-a") in phases
    assert sink.signals == result.signals


async def test_model_too_large_names_the_model(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(models=(SMALL,), vram_mib=8192)}
    async with crew_stack(gpus) as stack:
        coordinator = Coordinator(stack.agents, COORDINATOR, deadline_seconds=10)
        result = await coordinator.discuss(Thread("t1", "q"), [_member("a", HUGE)])
    assert result.settlement is Settlement.CAPACITY
    (aside,) = result.stand_asides()
    assert aside.metadata.reason == "model-too-large" and aside.metadata.model == HUGE
    assert HUGE in result.answer and "GPU" in result.answer
    assert gpus["gpu-a"].records == []  # no synthesis call: nothing to synthesise


async def test_prompt_too_large_and_model_too_large_together(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(models=(SMALL,), vram_mib=8192, context_length=256)}
    async with crew_stack(gpus) as stack:
        coordinator = Coordinator(stack.agents, COORDINATOR, deadline_seconds=10)
        question = "please read all of this: " + "very long context " * 200
        result = await coordinator.discuss(
            Thread("t1", question), [_member("a", HUGE), _member("b", "small:1b")]
        )
    reasons = sorted(s.metadata.reason or "" for s in result.stand_asides())
    assert reasons == ["model-too-large", "prompt-too-large"]
    assert result.settlement is Settlement.CAPACITY
    assert HUGE in result.answer and PROMPT_TOO_LARGE_TEXT in result.answer
    assert gpus["gpu-a"].records == []  # the over-long prompt never reached the engine


async def test_busy_gpus_give_the_gpu_busy_answer(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(models=(SMALL, BIG), vram_mib=8192)}
    async with crew_stack(gpus) as stack:
        # another process holds the whole card for a long call
        await stack.tickets.claim("gpu-a", "other:model", 7000, "someone-else",
                                  state=TicketState.RUNNING)
        sink = ListSink()
        coordinator = Coordinator(stack.agents, COORDINATOR, sink=sink, deadline_seconds=0.5)
        result = await coordinator.discuss(Thread("t1", "q"), [_member("a", "big:8b")])
    kinds = [s.type for s in sink.signals]
    assert SignalType.WAITING in kinds
    (aside,) = result.stand_asides()
    assert aside.metadata.reason == "gpu-busy"
    assert result.settlement is Settlement.CAPACITY
    assert result.answer == GPU_BUSY_TEXT
    assert [r.model for r in gpus["gpu-a"].records] == []
