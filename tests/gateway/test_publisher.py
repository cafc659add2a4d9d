"""Replicas probing one provider: a stale probe never overwrites a newer one."""

from __future__ import annotations

from kubemoot.clock import SystemClock
from kubemoot.gateway.server import NewestStatePublisher
from kubemoot.providers.protocol import ProviderState
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import provider_state


def _state(probed_at: float, *loaded: str) -> ProviderState:
    return provider_state("gpu-a", total_mib=8192, probed_at=probed_at,
                          loaded={m: 1000 for m in loaded})


async def test_a_probe_that_began_earlier_is_not_published_over_a_later_one() -> None:
    kv = MemoryKV(SystemClock())
    publish = NewestStatePublisher(await kv.bucket(PROVIDER_STATE_BUCKET))
    # the re-probe after a load (began at 20) is stored first; a periodic probe that
    # began at 10, before the load, arrives afterwards and must not erase the copy
    await publish(_state(20.0, "small:1b"))
    await publish(_state(10.0))
    stored = await publish.previous("gpu-a")
    assert stored is not None and [m.name for m in stored.loaded_models] == ["small:1b"]
    await publish(_state(30.0))
    stored = await publish.previous("gpu-a")
    assert stored is not None and stored.loaded_models == []
    await kv.close()
