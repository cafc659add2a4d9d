"""A NATS watch hands its changes to a reader as they arrive; the embedded one does not.

The provider view is the reader: on NATS every call's claim and release come back
through its ticket watch, and a task woken per change only filed it. On the embedded
store the view keeps its task, whose loop turns the simulator's decisions follow.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import RuntimeSettings
from kubemoot.store._watch import QueueWatch
from kubemoot.store.documents import ProviderTickets, Ticket, TicketState
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Change, HandingWatch
from kubemoot.testing.state import GIB, provider_state
from tests.store.conftest import StoreUnderTest


async def test_a_handed_over_watch_gives_the_pending_changes_first_then_each_as_it_comes(
    store: StoreUnderTest,
) -> None:
    bucket = await store.bucket("hand_over")
    watch = bucket.watch()
    await watch.ready()
    first = await bucket.put("a", b"1")
    second = await bucket.put("b", b"2")
    if store.kind == "nats":  # both delivered before the hand-over
        async with asyncio.timeout(10):
            while len(watch._pending) < 2:  # type: ignore[attr-defined]
                await asyncio.sleep(0.001)
    taken: list[Change] = []
    assert isinstance(watch, HandingWatch)
    handed = watch.hand_over(taken.append)
    assert handed is (store.kind == "nats")
    third = await bucket.put("a", b"3")
    if not handed:  # the embedded store: read as before, one change per turn
        changes = [await watch.__anext__() for _ in range(3)]
        assert [c.revision for c in changes] == [first, second, third]
        await watch.aclose()
        return
    async with asyncio.timeout(10):
        while len(taken) < 3:
            await asyncio.sleep(0.001)
    assert [(c.key, c.value, c.revision) for c in taken] == [
        ("a", b"1", first), ("b", b"2", second), ("a", b"3", third)]
    assert watch.drain() == []
    await watch.aclose()
    with pytest.raises(StopAsyncIteration):  # the end still comes by iterating
        await watch.__anext__()


async def test_the_views_watch_task_does_not_wake_per_change_on_nats(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty ticket writes reach the view; on NATS its watch tasks did not read one."""
    states, tickets = await store.bucket("hand_states"), await store.bucket("hand_tickets")
    await states.put(encode_token("gpu-a"), provider_state("gpu-a", usable_mib=16 * GIB)
                     .to_json())
    view = ProviderView(states, tickets, clock=store.clock, settings=RuntimeSettings(),
                        latency=LatencyTracker())
    assert await view.follow()
    await view.snapshot()
    await asyncio.sleep(0.05)  # the watch tasks are waiting
    reads = 0
    next_change = QueueWatch.__anext__

    async def counted(self: QueueWatch) -> Change:
        nonlocal reads
        reads += 1
        return await next_change(self)

    monkeypatch.setattr(QueueWatch, "__anext__", counted)
    key = encode_token("gpu-a")
    revision = None
    for i in range(20):
        now = store.clock.now()
        ticket = Ticket(ticket_id=f"t{i}", model="m", model_footprint_mib=0, holder_id="h",
                        state=TicketState.RUNNING, started_at=now, expires_at=now + 600)
        value = ProviderTickets(provider="gpu-a", tickets=[ticket]).to_json()
        revision = (await tickets.put(key, value) if revision is None
                    else await tickets.update(key, value, expected_revision=revision))

    def shown() -> Any:
        return view._pending.get((tickets.name, key))

    async with asyncio.timeout(10):
        while (change := shown()) is None or change.revision != revision:
            await asyncio.sleep(0.001)
    provider = (await view.snapshot()).provider("gpu-a")
    assert provider is not None and [t.ticket_id for t in provider.tickets] == ["t19"]
    if store.kind == "nats":
        assert reads == 0
    else:
        assert reads >= 20
    await view.close()
