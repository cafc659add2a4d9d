"""A call whose provider refuses the connection is placed once more, elsewhere.

DESIGN §5: a connection refused before any byte of the request left is the one failure
a call may try again, and never on the endpoint that refused it. The refused provider's
ticket goes back, its circuit counts the fault, and the call is placed with that provider
left out; where nothing else fits, the call gets the usual answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from kubemoot.agent.runtime import CallOutcome
from kubemoot.agent.wiring import RuntimeStack, build_stack
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.runtime.placement import Action, CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.memory import MemoryKV
from tests.agent.conftest import ollama_factory

SMALL = EmulatedModel("small:1b", 2000)
#: Two faults open a circuit: one refused call must count exactly once.
SETTINGS = RuntimeSettings().with_values({
    "load_rate_mibps": 1e6, "unload_seconds": 0.001, "default_latency_seconds": 0.05,
    "circuit_failure_threshold": 2, "circuit_cooldown_seconds": 30.0,
})


@dataclass
class Fleet:
    stack: RuntimeStack
    emulators: dict[str, OllamaEmulator]

    @property
    def circuits(self) -> CircuitBreakers:
        circuits = self.stack.view.circuits
        assert circuits is not None
        return circuits

    async def tickets(self) -> int:
        self.stack.view.invalidate()
        fleet = await self.stack.view.snapshot()
        return sum(len(p.tickets) for p in fleet.providers)


FleetMaker = Callable[[tuple[str, ...]], Awaitable[Fleet]]


@pytest.fixture
async def fleet_of(
    make_emulator: Callable[..., OllamaEmulator],
) -> AsyncIterator[FleetMaker]:
    """``gpu-a`` holds small:1b warm, then stops listening (its port refuses); the
    published state still shows the warm copy, so the cheapest placement is there."""
    made: list[tuple[Fleet, list[OllamaProvider], MemoryKV]] = []

    async def make(names: tuple[str, ...]) -> Fleet:
        clock = SystemClock()
        kv = MemoryKV(clock=clock)
        emulators = {n: make_emulator(models=(SMALL,), vram_mib=8192) for n in names}
        clients = {n: OllamaProvider(n, e.url, context_length=1024, num_parallel=2,
                                     total_vram_mib=8192, reserve_mib=512)
                   for n, e in emulators.items()}
        await clients["gpu-a"].preload(SMALL.name)
        states = await kv.bucket(PROVIDER_STATE_BUCKET)
        await Prober(list(clients.values()), clock=clock,
                     publish=publish_to_kv(states)).probe_all()
        stack = await build_stack(kv, clients=clients, client_factory=ollama_factory,
                                  clock=clock, settings=SETTINGS,
                                  declared={SMALL.name: 2000})
        emulators["gpu-a"].stop()  # its port now refuses every connection
        fleet = Fleet(stack, emulators)
        made.append((fleet, list(clients.values()), kv))
        return fleet

    yield make
    for fleet, clients, kv in made:
        await fleet.stack.close()
        for client in clients:
            await client.close()
        await kv.close()


async def _call(fleet: Fleet, *, wait: bool) -> CallOutcome:
    return await fleet.stack.agents.call(
        agent="crew/a", thread_id="t1", phase="mulling",
        messages=[{"role": "user", "content": "hello"}],
        candidates=[CandidateModel(SMALL.name, 50.0)], wait=wait,
    )


@pytest.mark.parametrize("wait", [False, True], ids=["cannot-wait", "waits"])
async def test_a_refused_call_lands_on_the_other_provider(
    fleet_of: FleetMaker, wait: bool
) -> None:
    fleet = await fleet_of(("gpu-a", "gpu-b"))
    outcome = await _call(fleet, wait=wait)

    assert outcome.ran and outcome.result is not None and outcome.result.ok
    assert outcome.placement is not None and outcome.placement.provider == "gpu-b"
    assert outcome.placement.action is Action.COLD_LOAD
    assert [r.path for r in fleet.emulators["gpu-b"].records] == ["/api/chat"]
    # the refusal was one fault on gpu-a's circuit, and nothing on gpu-b's
    assert fleet.circuits.failures("gpu-a") == 1
    assert fleet.circuits.failures("gpu-b") == 0
    # both attempts are on the books: the refused one, then the one that ran
    records = fleet.stack.agents.records
    assert [(r.provider, r.ok) for r in records] == [("gpu-a", False), ("gpu-b", True)]
    assert await fleet.tickets() == 0


async def test_with_nowhere_else_the_call_gets_the_usual_answer(
    fleet_of: FleetMaker,
) -> None:
    fleet = await fleet_of(("gpu-a",))
    outcome = await _call(fleet, wait=False)

    assert not outcome.ran
    assert outcome.refusal == "gpu-busy"
    # one attempt only: never a second try on the endpoint that refused
    assert [r.provider for r in fleet.stack.agents.records] == ["gpu-a"]
    assert fleet.circuits.failures("gpu-a") == 1
    assert await fleet.tickets() == 0
