"""``Model.spec.pinned`` in a cluster (issue 23 follow-up): the operator's probes publish
each provider's pinned models (what the runtime's eviction leaves alone), and the
operator loads back a pinned model its provider lost — through the runtime, as the
gateway does. kmock for the API server, a real emulated GPU, the operator's own loop.
"""

from __future__ import annotations

import pytest

from kubemoot.providers.ollama import OllamaProvider
from kubemoot.runtime.pinning import missing_pinned, pinned_by_provider
from kubemoot.settings import DEFAULTS
from kubemoot.store.documents import ProviderState, ProviderTickets, ResidentModel
from kubemoot.testing import builders as b

from .conftest import Cluster, Emulators, eventually, settle
from .test_operator_kopf import provider_manifest


async def state_of(cluster: Cluster) -> tuple[list[str], set[str]]:
    """gpu-a's published state: its pinned models, and what it holds loaded."""
    state = await cluster.kv_state("gpu-a")
    assert state is not None
    return state.pinned, {m.name for m in state.loaded_models}


async def probe_round(cluster: Cluster) -> None:
    """One round of the operator's probe timer: probe everything, then the pins."""
    await cluster.operator.call(cluster.reconciler.probe_all)
    await cluster.operator.call(cluster.reconciler.keep_pinned)


async def tickets_left(cluster: Cluster) -> int:
    runtime = cluster.reconciler.runtime
    assert runtime is not None

    async def count() -> int:
        total = 0
        for key in await runtime.tickets_bucket.keys():
            entry = await runtime.tickets_bucket.get(key)
            if entry is not None:
                total += len(ProviderTickets.from_json(entry.value).tickets)
        return total

    left: int = await cluster.operator.call(count)
    return left


async def test_pinned_models_are_published_loaded_and_loaded_again_when_lost(
    cluster: Cluster, emulators: Emulators
) -> None:
    gpu = emulators()
    await cluster.apply(provider_manifest("gpu-a", gpu))
    await cluster.apply(b.model("phi3-mini", model_id="phi3:mini", provider="gpu-a",
                                vram_mib=2048))
    await cluster.apply(b.model("qwen3-8b", model_id="qwen3:8b", provider="gpu-a",
                                vram_mib=5120, pinned=True))

    async def pinned_and_loaded() -> bool:
        return await state_of(cluster) == (["qwen3:8b"], {"qwen3:8b"})

    # Pinned on arrival: published with the provider's state and loaded at once.
    await eventually(pinned_and_loaded, what="qwen3:8b pinned and loaded on gpu-a")
    await settle(cluster)
    assert cluster.status("ModelProvider", "gpu-a")["capacity"]["loadedModelNames"] == \
        "qwen3:8b"
    assert gpu.stats()["loadsByModel"] == {"qwen3:8b": 1} and gpu.records == []  # no chat
    assert await tickets_left(cluster) == 0  # the load's ticket went back

    # The engine drops it (a restart, an OOM kill): the next probe round loads it back.
    async with OllamaProvider("someone", gpu.url) as client:
        await client.unload("qwen3:8b")
    await probe_round(cluster)
    await eventually(pinned_and_loaded, what="qwen3:8b loaded again")
    # The second time, with nothing lost: a round loads nothing.
    await probe_round(cluster)
    assert gpu.stats()["loadsByModel"] == {"qwen3:8b": 2}

    # Unpinned: the published state no longer protects it; a loss is left alone.
    await cluster.patch("Model", "qwen3-8b", {"spec": {"pinned": False}})

    async def unpinned() -> bool:
        return (await state_of(cluster))[0] == []

    await eventually(unpinned, what="the pin withdrawn from gpu-a's state")

    # Its copy was loaded to stay forever: now it has the keep-alive any copy has.
    async def ordinary() -> bool:
        return [c.keep_alive for _m, c in gpu.engine.copies()] == [
            DEFAULTS.engine_keep_alive_seconds]

    await eventually(ordinary, what="the unpinned copy given the ordinary keep-alive")
    assert gpu.stats()["loadsByModel"] == {"qwen3:8b": 2}  # renewed, not loaded again
    assert await tickets_left(cluster) == 0
    async with OllamaProvider("someone", gpu.url) as client:
        await client.unload("qwen3:8b")
    await probe_round(cluster)
    assert await state_of(cluster) == ([], set())
    assert gpu.stats()["loadsByModel"] == {"qwen3:8b": 2}


async def test_a_provider_not_ready_is_not_loaded_into(
    cluster: Cluster, emulators: Emulators
) -> None:
    gpu = emulators()
    gpu.fail_next(503, count=1000)  # the card does not answer its probes
    await cluster.apply(provider_manifest("gpu-a", gpu))
    await cluster.apply(b.model("qwen3-8b", model_id="qwen3:8b", provider="gpu-a",
                                vram_mib=5120, pinned=True))
    await eventually(lambda: cluster.status("ModelProvider", "gpu-a").get("ready") is False,
                     what="gpu-a found not ready")
    await settle(cluster)
    pinned, loaded = await state_of(cluster)
    assert pinned == ["qwen3:8b"] and loaded == set()
    assert gpu.stats()["loads"] == 0
    assert await tickets_left(cluster) == 0


def _state(provider: str, *, ready: bool = True, loaded: tuple[str, ...] = ()) -> ProviderState:
    return ProviderState(provider=provider, endpoint=f"http://{provider}:11434", ready=ready,
                         loaded_models=[ResidentModel(name=m, size_mib=1) for m in loaded])


@pytest.mark.parametrize(("states", "pins", "missing"), [
    ({"a": _state("a")}, {"a": ["m"]}, [("a", "m")]),
    ({"a": _state("a", loaded=("m",))}, {"a": ["m"]}, []),
    ({"a": _state("a", ready=False)}, {"a": ["m"]}, []),  # not ready: the next round
    ({}, {"a": ["m"]}, []),  # not probed yet
    ({"a": _state("a", loaded=("m",)), "b": _state("b")}, {"a": ["m", "n"], "b": ["m"]},
     [("a", "n"), ("b", "m")]),
])
def test_missing_pinned(states: dict[str, ProviderState], pins: dict[str, list[str]],
                        missing: list[tuple[str, str]]) -> None:
    assert missing_pinned(states, pins) == missing


def test_pinned_by_provider_reads_the_models_that_pin() -> None:
    models = [b.model("q-a", model_id="q:8b", provider="a", pinned=True),
              b.model("q-b", model_id="q:8b", provider="b", pinned=False),
              b.model("p-a", model_id="p:mini", provider="a", pinned=True),
              b.model("p-a2", model_id="p:mini", provider="a", pinned=True),
              b.model("r-c", model_id="r:1b", provider="c")]
    assert pinned_by_provider(models) == {"a": ["p:mini", "q:8b"]}
