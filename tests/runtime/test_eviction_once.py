"""One eviction is reported once, across replicas sharing a real nats-server.

A replica that priced on a view from just before another replica's claim plans the
same idle victim; the compare-and-set lets both plans through (they share the victim's
memory, DESIGN §5), and both used to list it in their placement, so one unload showed
up as two evictions (the dashboard's "Evictions 2", an ``X-Kubemoot-Evicted`` on both
replies). Now the claim whose ticket planned the victim first reports it; the other
says nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.runtime.builder import Runtime, build_runtime
from kubemoot.runtime.placement import Action, CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.store import open_store
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, ProviderTickets
from kubemoot.testing.emulators import emulator_factory
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.waiting import until_stored

pytestmark = pytest.mark.nats

BIG = EmulatedModel("big:14b", 6000)
LEFT = EmulatedModel("left:7b", 3000)
RIGHT = EmulatedModel("right:7b", 3000)
SIZES = {m.name: m.size_mib for m in (BIG, LEFT, RIGHT)}


@pytest.fixture
def make_emulator() -> Iterator[Callable[..., OllamaEmulator]]:
    with emulator_factory({"models": (BIG, LEFT, RIGHT), "vram_mib": 8192,
                           "reserve_mib": 512, "num_parallel": 1, "time_scale": 0.001,
                           "keep_alive_s": 300_000.0}) as make:
        yield make


class _HeldUnload(OllamaProvider):
    """Replica A's client: its unload waits for the test, so replica B claims while A's
    ticket already plans the victim (the race, made to happen every time)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.go = asyncio.Event()
        self.unloading = asyncio.Event()

    async def unload(self, model: str) -> None:
        self.unloading.set()
        await self.go.wait()
        await super().unload(model)


async def test_one_eviction_is_counted_once_across_two_replicas(
    nats: NatsServer, make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator()
    card = {"context_length": 1024, "num_parallel": 1, "total_vram_mib": 8192,
            "reserve_mib": 512}
    held = _HeldUnload("gpu-a", emulator.url, **card)
    plain = OllamaProvider("gpu-a", emulator.url, **card)  # type: ignore[arg-type]
    await plain.preload(BIG.name)  # idle: the only victim either plan can pick
    clock = SystemClock()
    # replica B reads the state once and keeps it (no watch, a long cache window): it
    # prices on the fleet as it was before A's claim, as a replica a moment behind does
    settings = RuntimeSettings()
    behind = settings.with_values({"state_cache_seconds": 3600.0})
    stores = [await open_store(nats.url), await open_store(nats.url)]
    await Prober([plain], clock=clock, publish=publish_to_kv(
        await stores[0].bucket(PROVIDER_STATE_BUCKET))).probe_all()
    replicas: list[Runtime] = []
    for kv, client, tunables in zip(stores, (held, plain), (settings, behind), strict=True):
        runtime = await build_runtime(kv, clock=clock, settings=tunables,
                                      clients={"gpu-a": client}, declared=SIZES)
        replicas.append(runtime)
    a, b = replicas
    await a.start()
    await b.start(follow=False, watch=False)
    try:
        await b.view.snapshot()  # B's view: big:14b idle, no ticket anywhere
        first = asyncio.ensure_future(a.planner.place([CandidateModel(LEFT.name)], holder_id="a"))
        await asyncio.wait_for(held.unloading.wait(), 30)  # A's ticket plans big:14b

        async def planned() -> bool:
            entry = await b.tickets_bucket.get("gpu-a")
            return entry is not None and any(
                BIG.name in t.evicts for t in ProviderTickets.from_json(entry.value).tickets)

        await until_stored(b.tickets_bucket, planned, timeout=30, what="A's plan in NATS")
        # B still prices on its old view, where big:14b is an idle victim nobody planned
        second = await b.planner.place([CandidateModel(RIGHT.name)], holder_id="b")
        held.go.set()
        placed = [await first, second]
        assert [p.action for p in placed] == [Action.UNLOAD, Action.UNLOAD]
        # both plans unloaded big:14b; the eviction is A's, whose ticket came first
        assert [p.evicted for p in placed] == [(BIG.name,), ()]
        for runtime, placement in zip(replicas, placed, strict=True):
            await runtime.planner.release(placement)
    finally:
        for runtime in replicas:
            await runtime.close()
        for kv in stores:
            await kv.close()
        await held.close()
        await plain.close()
