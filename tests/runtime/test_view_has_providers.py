"""``ProviderView.has_providers``: true only when a snapshot taken now would show a
provider, so a caller may skip the snapshot on True and must take it otherwise."""

from __future__ import annotations

import asyncio

from kubemoot.clock import ManualClock
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import RuntimeSettings
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import Bucket
from kubemoot.testing.state import GIB, NOW, provider_state

PROVIDER = "gpu-a"
#: Long enough for the view to read the states again and list their keys again.
LATER = max(RuntimeSettings().state_cache_seconds, RuntimeSettings().discovery_seconds)


async def _view(clock: ManualClock) -> tuple[MemoryKV, Bucket, ProviderView]:
    kv = MemoryKV(clock=clock)
    states, tickets = await kv.bucket("states"), await kv.bucket("tickets")
    view = ProviderView(states, tickets, clock=clock, settings=RuntimeSettings(),
                        latency=LatencyTracker())
    return kv, states, view


async def _publish(states: Bucket) -> None:
    await states.put(encode_token(PROVIDER),
                     provider_state(PROVIDER, usable_mib=16 * GIB).to_json())


async def test_reading_it_is_true_only_while_the_last_read_is_fresh() -> None:
    clock = ManualClock(NOW)
    kv, states, view = await _view(clock)
    assert not view.has_providers  # nothing read yet
    await view.snapshot()
    assert not view.has_providers  # read, and no provider had published
    await _publish(states)
    await view.snapshot()  # within the cache: the empty read stands
    assert not view.has_providers
    clock.advance(LATER)
    assert (await view.snapshot()).providers
    assert view.has_providers
    await states.delete(encode_token(PROVIDER))
    clock.advance(RuntimeSettings().state_cache_seconds)
    # the provider went away: unknown until a read says so, and the read agrees
    assert not view.has_providers
    assert not (await view.snapshot()).providers
    await kv.close()


async def test_following_a_waiting_change_of_a_state_makes_it_unknown() -> None:
    clock = ManualClock(NOW)
    kv, states, view = await _view(clock)
    await _publish(states)
    assert await view.follow()
    assert (await view.snapshot()).providers
    assert view.has_providers
    clock.advance(10 * LATER)
    assert view.has_providers  # following: the documents stay current without reads
    await states.delete(encode_token(PROVIDER))
    await asyncio.sleep(0.05)  # the watch files the deletion, not yet applied
    assert not view.has_providers
    assert not (await view.snapshot()).providers
    assert not view.has_providers
    await view.close()
    await kv.close()
