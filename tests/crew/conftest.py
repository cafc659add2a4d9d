"""A crew of agent "processes" in one test: each has its own runtime stack, they share
the store (as processes share NATS) and talk over a bus; real emulated GPUs."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubemoot.agent.discussion import AgentProfile
from kubemoot.agent.pool import CallSettings
from kubemoot.agent.process import AgentIdentity, serve_agent
from kubemoot.agent.remote import CrewRef
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.providers.protocol import ProviderClient
from kubemoot.settings import CrewSettings, RuntimeSettings, Settings
from kubemoot.store.bus import Bus
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, ProviderState
from kubemoot.store.protocol import KV
from kubemoot.testing.emulators import emulator_factory

SMALL = EmulatedModel("phi3:mini", 2048)
MEDIUM = EmulatedModel("qwen3:8b", 5120)
OTHER = EmulatedModel("llama3.1:8b", 5120)
#: A card that holds one 8B model beside one phi3:mini, nothing more.
CARD: dict[str, object] = {
    "models": (SMALL, MEDIUM, OTHER), "vram_mib": 8192, "num_parallel": 1, "context_length": 4096,
    "load_rate_mibps": 100000.0, "base_latency_s": 0.5, "per_token_s": 0.0,
    "time_scale": 0.01, "keep_alive_s": 30_000.0,
}
CREW = CrewRef("crew-a", "pilot")
#: The runtime's costs match the fast cards; a silent member is given up after 2 s.
FAST = Settings(
    runtime=RuntimeSettings().with_values({
        "load_rate_mibps": 100000.0, "unload_seconds": 0.01, "default_latency_seconds": 5.0,
        "gpu_wait_limit_seconds": 20.0, "reserve_mib": 1024}),
    crew=CrewSettings(roll_call_seconds=0.2, heartbeat_seconds=0.2, silence_seconds=2.0),
)


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., OllamaEmulator]]:
    with emulator_factory(CARD) as make:
        yield make


def candidates(*models: str) -> str:
    return json.dumps([{"model": m, "score": 70 - 10 * i} for i, m in enumerate(models)])


def binding(mulling: tuple[str, ...], triage: str | None = None) -> dict[str, str]:
    """The env the operator templates for one Agent."""
    env = {"KUBEMOOT_MODEL_MODEL": mulling[0],
           "KUBEMOOT_MODEL_CANDIDATES_MULLING": candidates(*mulling)}
    if triage is not None:
        env["KUBEMOOT_TRIAGE_MODEL_MODEL_ID"] = triage
    return env


async def publish_providers(kv: KV, gpus: Mapping[str, OllamaEmulator]) -> None:
    """What the operator's prober does: each provider's state in the shared bucket."""
    clients = [OllamaProvider(name, e.url, context_length=e.config.context_length,
                              num_parallel=e.config.num_parallel,
                              total_vram_mib=e.config.vram_mib, reserve_mib=1024)
               for name, e in gpus.items()]
    prober = Prober(clients, clock=SystemClock(),
                    publish=publish_to_kv(await kv.bucket(PROVIDER_STATE_BUCKET)))
    await prober.probe_all()
    for client in clients:
        await client.close()


def make_client(state: ProviderState) -> ProviderClient:
    return OllamaProvider(state.provider, state.endpoint, context_length=state.context_length,
                          num_parallel=state.max_parallel, reserve_mib=state.reserve_mib,
                          total_vram_mib=state.total_vram_mib)


def chat_client(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
    return OllamaProvider(provider, endpoint, timeout=settings.timeout)


@dataclass
class Crew:
    """Agent "processes" started with :meth:`start`; each one a task."""

    kv: KV
    bus: Bus
    settings: Settings = FAST
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def start(self, name: str, env: Mapping[str, str], *, role: str = "member",
                    replica: int = 0, settings: Settings | None = None) -> None:
        up = asyncio.Event()

        def ready(_: AgentProfile) -> None:
            up.set()

        identity = AgentIdentity(name, CREW.namespace, CREW, role)
        task = asyncio.create_task(serve_agent(
            self.kv, self.bus, identity, env=env, settings=settings or self.settings,
            make_client=make_client, chat_factory=chat_client, clock=SystemClock(),
            ready=ready))
        self.tasks[name if not replica else f"{name}#{replica}"] = task
        done, _ = await asyncio.wait([task, asyncio.ensure_future(up.wait())],
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # raises what stopped it

    async def stop(self, name: str) -> None:
        task = self.tasks.pop(name)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def ask(self, question: str) -> dict[str, Any]:
        raw = await self.bus.request(CREW.ask_subject(), json.dumps({"question": question})
                                     .encode(), timeout=60.0)
        body: dict[str, Any] = json.loads(raw)
        return body

    async def close(self) -> None:
        for name in list(self.tasks):
            await self.stop(name)


@contextlib.asynccontextmanager
async def running_crew(kv: KV, bus: Bus, settings: Settings = FAST
                       ) -> AsyncIterator[Crew]:
    crew = Crew(kv, bus, settings)
    try:
        yield crew
    finally:
        await crew.close()
