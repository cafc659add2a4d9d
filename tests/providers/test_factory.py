"""One client factory: every provider client of a process comes from the settings its
entry point read, and nothing but the factory constructs the Ollama adapter."""

from __future__ import annotations

import ast
from pathlib import Path

from kubemoot.clock import ManualClock
from kubemoot.providers.factory import ProviderClients
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.settings import Settings
from kubemoot.store.documents import ProviderState
from kubemoot.testing.emulators import emulator_factory

SRC = Path(__file__).resolve().parents[2] / "src" / "kubemoot"
URL = "http://127.0.0.1:1"


def test_the_clients_carry_the_timeouts_the_entry_point_read() -> None:
    read = Settings.from_env({"KUBEMOOT_PROVIDER_READ_TIMEOUT_SECONDS": "7.5",
                              "KUBEMOOT_PROVIDER_CALL_DEADLINE_SECONDS": "40"})
    clock = ManualClock(0.0)
    factory = ProviderClients.of(read.runtime, clock=clock)
    client = factory.client("p", URL)
    assert (client.timeout, client.deadline) == (7.5, 40.0)
    # a client that asks for its own timeouts (a probe, a chat pool's setting) keeps them
    own = factory.client("p", URL, timeout=3.0, deadline=3.0)
    assert (own.timeout, own.deadline) == (3.0, 3.0)


def test_a_client_for_a_published_state_takes_its_capacity() -> None:
    state = ProviderState(provider="gpu-a", endpoint=URL, ready=True, context_length=8192,
                          max_parallel=2, reserve_mib=512, total_vram_mib=24576)
    client = ProviderClients().for_state(state)
    assert (client.name, client.endpoint, client.context_length, client.num_parallel,
            client.reserve_mib, client.total_vram_mib) == ("gpu-a", URL, 8192, 2, 512, 24576)


async def test_a_client_of_its_own_kind_probes_a_real_engine() -> None:
    class Counting(OllamaProvider):
        probes = 0

        async def probe(self) -> ProviderState:
            type(self).probes += 1
            return await super().probe()

    with emulator_factory({"vram_mib": 16384}) as make:
        engine = make()
        client = ProviderClients(kind=Counting).client("gpu-a", engine.url,
                                                       total_vram_mib=16384)
        try:
            assert isinstance(client, Counting)
            state = await client.probe()
        finally:
            await client.close()
    assert state.ready and Counting.probes == 1


def test_only_the_factory_constructs_the_ollama_adapter() -> None:
    """A new construction site would pick its own timeouts; it must ask the factory."""
    builders = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "OllamaProvider"):
                builders.append(str(path.relative_to(SRC)))
    assert builders == [], builders
