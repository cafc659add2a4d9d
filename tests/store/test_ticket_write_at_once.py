"""An idle lane's operation written in its caller's turn, where the store hands over
the acknowledgement (NATS: ``HandingBucket.update_then``).

On NATS an uncontended claim or release starts no task of the lane's: it is decided
and sent in the caller's turn and settled as the read loop reads the acknowledgement.
On the embedded store the lane's task serves it as before (the simulator's decisions
follow those loop turns). Whatever such a write meets besides a win (a lost race, an
outage) goes on in the lane's task; a caller cancelled meanwhile leaves no ticket.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from kubemoot import metrics
from kubemoot.runtime.tickets import ClaimRejected, TicketManager
from kubemoot.store.documents import ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, StoreError
from kubemoot.testing.state import GIB, provider_state
from kubemoot.testing.waiting import until_stored, wait_until
from tests.store.conftest import StoreUnderTest

PROVIDER = "gpu-a"
KEY = encode_token(PROVIDER)


# Only a store that hands acknowledgements over (NATS) writes in the caller's turn, and
# a stream deleted under the store is NATS's own: these run on NATS alone.
_NATS_ONLY = pytest.mark.parametrize("store", ["nats"], indirect=True)


async def _manager(store: StoreUnderTest, usable_mib: int = 16 * GIB,
                   ) -> tuple[TicketManager, Bucket, ProviderState]:
    """A manager holding the document it wrote (one claim and release made), and the
    provider's state as a caller would hand it in."""
    tickets = await store.bucket("tickets")
    states = await store.bucket("states")
    state = provider_state(PROVIDER, usable_mib=usable_mib)
    await states.put(KEY, state.to_json())
    manager = TicketManager(tickets, states, clock=store.clock, rng=random.Random(5))
    warm = await manager.claim(PROVIDER, "warm-up", GIB, "h", provider_state=state)
    await manager.release(PROVIDER, warm.ticket_id)
    return manager, tickets, state


def _count_serves(manager: TicketManager, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lanes whose task is started from now on, one entry per start."""
    started: list[str] = []
    serve = manager._serve

    def counted(provider: str, *args: Any, **kwargs: Any) -> Any:
        started.append(provider)
        return serve(provider, *args, **kwargs)

    monkeypatch.setattr(manager, "_serve", counted)
    return started


def _cas_conflicts() -> float:
    value = metrics.REGISTRY.get_sample_value("kubemoot_ticket_cas_conflicts_total", {})
    return 0.0 if value is None else value


async def _ticket_ids(manager: TicketManager) -> list[str]:
    return [t.ticket_id for t in await manager.active(PROVIDER)]


async def test_an_idle_lanes_claim_and_release_start_no_task_on_nats_only(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager, _tickets, state = await _manager(store)
    started = _count_serves(manager, monkeypatch)
    for i in range(5):
        ticket = await manager.claim(PROVIDER, "m", 2 * GIB, f"h{i}", provider_state=state)
        assert await _ticket_ids(manager) == [ticket.ticket_id]
        await manager.release(PROVIDER, ticket.ticket_id)
        assert await _ticket_ids(manager) == []
    # NATS hands the acknowledgement over; the embedded store keeps the task's turns
    assert started == ([] if store.kind == "nats" else [PROVIDER] * 10)
    await manager.aclose()


async def test_operations_queued_behind_such_a_write_go_in_one_write_after_it(
    store: StoreUnderTest,
) -> None:
    manager, tickets, state = await _manager(store)
    before = await tickets.get(KEY)
    assert before is not None
    granted = await asyncio.gather(*(
        manager.claim(PROVIDER, "m", 2 * GIB, f"h{i}", provider_state=state)
        for i in range(4)))
    assert sorted(await _ticket_ids(manager)) == sorted(t.ticket_id for t in granted)
    after = await tickets.get(KEY)
    assert after is not None
    # NATS: the first written at once, the three queued behind it in one write after
    # it; embedded: all four in the task's one write
    assert after.revision - before.revision == (2 if store.kind == "nats" else 1)
    await manager.aclose()


async def test_a_lost_race_on_the_kept_copy_is_decided_again_without_overcommit(
    store: StoreUnderTest,
) -> None:
    """Another writer took the room behind the lane's copy: the write sent on that copy
    loses, and the claim, decided again on the document as it is, is refused."""
    manager, tickets, state = await _manager(store, usable_mib=8 * GIB)
    other = TicketManager(tickets, await store.bucket("unused_states"), clock=store.clock,
                          rng=random.Random(6))
    taken = await other.claim(PROVIDER, "other", 6 * GIB, "them", provider_state=state)
    conflicts = _cas_conflicts()
    with pytest.raises(ClaimRejected):
        await manager.claim(PROVIDER, "m", 6 * GIB, "us", provider_state=state)
    assert await _ticket_ids(manager) == [taken.ticket_id]
    # the lost race counted as the lane's own losses are (it backs off, follows, ...)
    assert _cas_conflicts() == conflicts + 1
    # room for a small one: the lane decides on the document it has read since
    small = await manager.claim(PROVIDER, "m", GIB, "us", provider_state=state)
    assert sorted(await _ticket_ids(manager)) == sorted([taken.ticket_id, small.ticket_id])
    await manager.aclose()
    await other.aclose()


async def test_a_caller_cancelled_while_its_claim_is_written_leaves_no_ticket(
    store: StoreUnderTest,
) -> None:
    manager, tickets, state = await _manager(store)
    claiming = asyncio.create_task(
        manager.claim(PROVIDER, "m", 2 * GIB, "h", provider_state=state))
    await asyncio.sleep(0)  # decided and sent (NATS), or queued for the lane's task
    claiming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claiming

    async def none_left() -> bool:
        return await _ticket_ids(manager) == []

    await until_stored(tickets, none_left, timeout=30, what="the orphan's release")
    await manager.aclose()


async def test_a_caller_cancelled_as_its_grant_is_heard_gives_it_back(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelled in the very turn its future was settled (before the caller woke): the
    future holds the ticket, not a cancellation, and the ticket goes back."""
    manager, tickets, state = await _manager(store)
    claiming: list[asyncio.Task[Any]] = []
    finish = manager._finish

    def finish_then_cancel(*args: Any, **kwargs: Any) -> None:
        finish(*args, **kwargs)
        if claiming and not claiming[0].done():
            claiming[0].cancel()

    monkeypatch.setattr(manager, "_finish", finish_then_cancel)
    claiming.append(asyncio.create_task(
        manager.claim(PROVIDER, "m", 2 * GIB, "h", provider_state=state)))
    with pytest.raises(asyncio.CancelledError):
        await claiming[0]

    async def none_left() -> bool:
        return await _ticket_ids(manager) == []

    await until_stored(tickets, none_left, timeout=30, what="the orphan's release")
    await manager.aclose()


@_NATS_ONLY
async def test_closing_waits_for_such_a_write_and_the_release_it_leaves(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim cancelled while its write waits for the acknowledgement, and the manager
    closed meanwhile: close returns only after the grant is heard and its release
    written (nobody else waits for that release)."""
    manager, _tickets, state = await _manager(store)
    held: list[tuple[Any, ...]] = []
    heard = manager._heard

    def hold(*args: Any) -> None:  # the acknowledgement, kept until the test says
        held.append(args)

    monkeypatch.setattr(manager, "_heard", hold)
    claiming = asyncio.create_task(
        manager.claim(PROVIDER, "m", 2 * GIB, "h", provider_state=state))
    await asyncio.sleep(0)  # decided and sent
    claiming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claiming
    closing = asyncio.create_task(manager.aclose())
    await wait_until(lambda: bool(held), timeout=30, what="the acknowledgement")
    for _ in range(20):  # every chance to return early
        await asyncio.sleep(0)
    assert not closing.done()
    heard(*held[0])  # the grant is heard: its caller is gone, so it goes back
    await asyncio.wait_for(closing, 30)
    assert await _ticket_ids(manager) == []


@_NATS_ONLY
async def test_an_outage_met_by_such_a_write_goes_on_in_the_lane(
    store: StoreUnderTest,
) -> None:
    """The stream deleted under the lane's copy: the write fails as unavailable, the
    lane's task reads afresh and its caller hears the store's error, as from a write
    of the task's own, rather than waiting for ever."""
    manager, tickets, state = await _manager(store)
    nats_kv: Any = store.kv
    await nats_kv.connection.jetstream().delete_stream(f"KV_{tickets.name}")
    with pytest.raises(StoreError):
        await asyncio.wait_for(
            manager.claim(PROVIDER, "m", 2 * GIB, "h", provider_state=state), 30)
    await manager.aclose()


@_NATS_ONLY
async def test_a_bug_after_such_a_write_is_heard_still_answers_the_caller(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The acknowledgement is handled in the store's read loop: a bug there must still
    answer the caller (with the error, as the lane's task answers a batch that met
    one), and the lane serves the next operation."""
    manager, _tickets, state = await _manager(store)
    wrote = manager._wrote

    def broken(*args: Any) -> None:
        raise RuntimeError("a bug in the bookkeeping after a write")

    monkeypatch.setattr(manager, "_wrote", broken)
    with pytest.raises(RuntimeError, match="bookkeeping"):
        await asyncio.wait_for(
            manager.claim(PROVIDER, "m", 2 * GIB, "h1", provider_state=state), 30)
    monkeypatch.setattr(manager, "_wrote", wrote)
    ticket = await asyncio.wait_for(
        manager.claim(PROVIDER, "m", 2 * GIB, "h2", provider_state=state), 30)
    assert ticket.ticket_id in await _ticket_ids(manager)
    await manager.aclose()
