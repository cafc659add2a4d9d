"""A provisional state (an agent's direct probe) stands in for the operator's only
until a state of its own arrives for the same endpoint: from then on the view does not
offer the stand-in, even before the agent withdraws it, so one card is never offered
under two names (its copies would look idle there, free of the real provider's
tickets, and a warm call would take a slot twice over)."""

from __future__ import annotations

import asyncio

import pytest

from kubemoot.clock import ManualClock
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import RuntimeSettings
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, NOW, provider_state

ENDPOINT = "http://127.0.0.1:11434"
DIRECT = "direct:127.0.0.1:11434"


async def _settle() -> None:
    """Let a followed store's watch deliver what was just written."""
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.mark.parametrize("following", [False, True])
async def test_a_provisional_state_steps_aside_while_a_real_one_serves_its_endpoint(
    following: bool,
) -> None:
    clock = ManualClock(NOW)
    kv = MemoryKV(clock=clock)
    states, tickets = await kv.bucket("states"), await kv.bucket("tickets")
    view = ProviderView(states, tickets, clock=clock, settings=RuntimeSettings(),
                        latency=LatencyTracker())
    later = max(RuntimeSettings().state_cache_seconds, RuntimeSettings().discovery_seconds)
    try:
        await states.put(encode_token(DIRECT), provider_state(
            DIRECT, endpoint=ENDPOINT, loaded={"qwen3:8b": 6 * GIB}, slots=2,
            provisional=True).to_json())
        if following:
            assert await view.follow()
        shown = (await view.snapshot()).provider(DIRECT)
        assert shown is not None and shown.state.ready  # alone, it stands in

        await states.put(encode_token("gpu-a"), provider_state(
            "gpu-a", endpoint=ENDPOINT + "/", usable_mib=23 * GIB,
            loaded={"qwen3:8b": 6 * GIB}, slots=2).to_json())
        clock.advance(later)
        await _settle()
        fleet = await view.snapshot()
        shown = fleet.provider(DIRECT)
        real = fleet.provider("gpu-a")
        assert real is not None and real.state.ready
        assert shown is not None and not shown.state.ready
        assert shown.state.reason == "provider gpu-a serves its endpoint"

        await states.delete(encode_token("gpu-a"))  # the operator's state went away
        clock.advance(later)
        await _settle()
        shown = (await view.snapshot()).provider(DIRECT)
        assert shown is not None and shown.state.ready
    finally:
        await view.close()
        await kv.close()
