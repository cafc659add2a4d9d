"""A state document this process wrote reaches the view as written, not parsed back."""

from __future__ import annotations

import asyncio

import pytest

from kubemoot.clock import ManualClock
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, NOW, provider_state


@pytest.mark.parametrize("following", [True, False])
async def test_a_state_written_here_is_taken_as_written(
    following: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(NOW)
    kv = MemoryKV(clock=clock)
    states, tickets = await kv.bucket("states"), await kv.bucket("tickets")
    view = ProviderView(states, tickets, clock=clock, settings=RuntimeSettings(),
                        latency=LatencyTracker())
    if following:
        assert await view.follow()
    await view.snapshot()
    parsed: list[bytes] = []
    real = ProviderState.from_json

    def counted(value: bytes) -> ProviderState:
        parsed.append(value)
        return real(value)

    monkeypatch.setattr(ProviderState, "from_json", staticmethod(counted))
    for usable in (8, 12):
        document = provider_state("gpu-a", usable_mib=usable * GIB)
        revision = await states.put(encode_token("gpu-a"), document.to_json())
        view.note_state_written(revision, document)
        await asyncio.sleep(0)  # a following view's watch files the change
        if not following:
            view.invalidate()  # a reading view lists and reads again
        p = (await view.snapshot()).provider("gpu-a")
        assert p is not None and p.state is document
        stored = await states.get(encode_token("gpu-a"))
        assert stored is not None and real(stored.value) == document
    assert parsed == []
    # another writer's document, unknown to the view, is parsed as before
    other = provider_state("gpu-a", usable_mib=4 * GIB)
    await states.put(encode_token("gpu-a"), other.to_json())
    await asyncio.sleep(0)
    if not following:
        view.invalidate()
    p = (await view.snapshot()).provider("gpu-a")
    assert p is not None and p.state == other and p.state is not other
    assert len(parsed) == 1
    await view.close()
    await kv.close()


async def test_an_older_revision_written_does_not_replace_a_newer_one() -> None:
    clock = ManualClock(NOW)
    kv = MemoryKV(clock=clock)
    states, tickets = await kv.bucket("states"), await kv.bucket("tickets")
    view = ProviderView(states, tickets, clock=clock, settings=RuntimeSettings(),
                        latency=LatencyTracker())
    assert await view.follow()
    old = provider_state("gpu-a", usable_mib=8 * GIB)
    old_revision = await states.put(encode_token("gpu-a"), old.to_json())
    new = provider_state("gpu-a", usable_mib=12 * GIB)
    await states.put(encode_token("gpu-a"), new.to_json())
    await asyncio.sleep(0)
    first = (await view.snapshot()).provider("gpu-a")
    assert first is not None and first.state == new
    view.note_state_written(old_revision, old)  # late: the newer one stays
    view.invalidate("gpu-a")
    again = (await view.snapshot()).provider("gpu-a")
    assert again is not None and again.state == new
    await view.close()
    await kv.close()
