"""A finished call's release returns once its write is sent (``TicketManager.release_sent``).

On NATS an idle lane sends the release in its caller's turn and the call returns: the
acknowledgement is heard by the lane as the read loop reads it, and only then does the
provider view drop the ticket. What the call does not wait for must still hold: this
process's next claim on the card queues behind the release and never sees the memory
twice, a lost race is decided again, and a release the store refused is tried again
until the store answers. The embedded store does not hand acknowledgements over, so
there the release is awaited as before (the simulator's turns).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from kubemoot import metrics
from kubemoot.clock import ManualClock
from kubemoot.runtime.builder import build_runtime
from kubemoot.runtime.placement import CandidateModel
from kubemoot.runtime.tickets import TicketManager
from kubemoot.store.documents import ProviderState, ProviderTickets, Ticket
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import (
    Bucket,
    Entry,
    StoreError,
    StoreUnavailable,
    Watch,
)
from kubemoot.testing.state import GIB, provider_state
from kubemoot.testing.waiting import wait_until
from tests.store.conftest import StoreUnderTest

PROVIDER = "gpu-a"
KEY = encode_token(PROVIDER)

_NATS_ONLY = pytest.mark.parametrize("store", ["nats"], indirect=True)


async def _manager(store: StoreUnderTest, usable_mib: int = 8 * GIB,
                   ) -> tuple[TicketManager, Bucket]:
    """A manager whose lane holds the document it wrote (one claim and release made)."""
    tickets = await store.bucket("tickets")
    states = await store.bucket("states")
    await states.put(KEY, provider_state(PROVIDER, usable_mib=usable_mib).to_json())
    manager = TicketManager(tickets, states, clock=store.clock, rng=random.Random(5))
    warm = await manager.claim(PROVIDER, "warm-up", GIB, "h",
                               provider_state=provider_state(PROVIDER, usable_mib=usable_mib))
    await manager.release(PROVIDER, warm.ticket_id)
    return manager, tickets


def _hold_acknowledgements(manager: TicketManager,
                           monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[Any, ...]],
                                                                     Callable[..., None]]:
    """Keep every acknowledgement the lane would hear until the test passes it on."""
    held: list[tuple[Any, ...]] = []
    heard = manager._heard
    monkeypatch.setattr(manager, "_heard", lambda *args: held.append(args))
    return held, heard


async def _stored_tickets(tickets: Bucket) -> list[str]:
    entry = await tickets.get(KEY)
    return [] if entry is None else [
        t.ticket_id for t in ProviderTickets.from_json(entry.value).tickets]


async def test_a_release_is_sent_without_waiting_on_nats_only(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager, tickets = await _manager(store)
    state = provider_state(PROVIDER, usable_mib=8 * GIB)
    ticket = await manager.claim(PROVIDER, "m", 2 * GIB, "h1", provider_state=state)
    held, heard = _hold_acknowledgements(manager, monkeypatch)
    outcomes: list[BaseException | None] = []
    sent = manager.release_sent(PROVIDER, ticket.ticket_id, outcomes.append)
    if store.kind == "memory":  # no acknowledgement to hand over: awaited as before
        assert not sent and held == [] and outcomes == []
        await manager.aclose()
        return
    assert sent
    await wait_until(lambda: bool(held), timeout=30, what="the release's acknowledgement")
    for _ in range(10):
        await asyncio.sleep(0)
    assert outcomes == []  # not told before the acknowledgement is heard
    heard(*held[0])
    await manager.quiet()
    await asyncio.sleep(0)
    assert outcomes == [None]
    assert await _stored_tickets(tickets) == []
    await manager.aclose()


@_NATS_ONLY
async def test_a_claim_behind_a_sent_release_waits_for_it_and_never_overcommits(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An 8 GiB card holds 6 GiB; the release is sent and its acknowledgement held;
    a claim of 6 GiB right after it is not written before the lane has heard the
    release (it is decided on the document the release wrote), and is granted then."""
    manager, tickets = await _manager(store)
    state = provider_state(PROVIDER, usable_mib=8 * GIB)
    first = await manager.claim(PROVIDER, "m", 6 * GIB, "h1", provider_state=state)
    held, heard = _hold_acknowledgements(manager, monkeypatch)
    assert manager.release_sent(PROVIDER, first.ticket_id, lambda _error: None)
    claiming = asyncio.create_task(
        manager.claim(PROVIDER, "m", 6 * GIB, "h2", provider_state=state))
    await wait_until(lambda: bool(held), timeout=30, what="the release's acknowledgement")
    for _ in range(10):
        await asyncio.sleep(0)
    assert not claiming.done()  # queued behind the write in flight
    assert await _stored_tickets(tickets) == []  # the release landed, the claim waits
    monkeypatch.setattr(manager, "_heard", heard)
    heard(*held[0])
    second = await asyncio.wait_for(claiming, 30)
    assert await _stored_tickets(tickets) == [second.ticket_id]
    await manager.aclose()


@_NATS_ONLY
async def test_a_sent_release_that_loses_a_race_is_decided_again(
    store: StoreUnderTest,
) -> None:
    """Another process wrote the document behind the lane's copy: the release sent on
    that copy loses, the lane reads and releases again, the other's ticket stays."""
    manager, tickets = await _manager(store)
    state = provider_state(PROVIDER, usable_mib=8 * GIB)
    ours = await manager.claim(PROVIDER, "m", 2 * GIB, "us", provider_state=state)
    other = TicketManager(tickets, await store.bucket("unused_states"), clock=store.clock,
                          rng=random.Random(6))
    theirs = await other.claim(PROVIDER, "m", 2 * GIB, "them", provider_state=state)
    outcomes: list[BaseException | None] = []
    assert manager.release_sent(PROVIDER, ours.ticket_id, outcomes.append)
    await wait_until(lambda: bool(outcomes), timeout=30, what="the release's outcome")
    assert outcomes == [None]
    assert await _stored_tickets(tickets) == [theirs.ticket_id]
    await manager.aclose()
    await other.aclose()


async def _placed_runtime(store: StoreUnderTest) -> tuple[Any, Any]:
    """A runtime with one provider and a placed call on it."""
    runtime = await build_runtime(store.kv, clock=store.clock, declared={"m:1b": 1024})
    state = provider_state(PROVIDER, usable_mib=8 * GIB, loaded={"m:1b": 1024})
    await runtime.states.put(KEY, state.to_json())
    await runtime.start(watch=False)
    placement = await runtime.planner.place([CandidateModel("m:1b", 70)], holder_id="h",
                                            prompt_tokens=100)
    assert placement.ticket is not None
    return runtime, placement


def _view_tickets(runtime: Any) -> list[str]:
    docs = runtime.planner.view._docs
    current = docs.get(PROVIDER)
    if current is None or current[1] is None:
        return []
    return [t.ticket_id for t in current[1].tickets]


@_NATS_ONLY
async def test_the_planners_release_returns_before_the_acknowledgement_and_the_view_follows(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the change ``CallPlanner.release`` waits for the held acknowledgement
    (and times out here)."""
    runtime, placement = await _placed_runtime(store)
    manager = runtime.planner.tickets
    held, heard = _hold_acknowledgements(manager, monkeypatch)
    await asyncio.wait_for(runtime.planner.release(placement), 5)
    await wait_until(lambda: bool(held), timeout=30, what="the release's acknowledgement")
    # the view drops the ticket only once the release is heard
    assert _view_tickets(runtime) == [placement.ticket.ticket_id]
    heard(*held[0])
    await manager.quiet()
    await asyncio.sleep(0)
    assert _view_tickets(runtime) == []
    await runtime.close()


class _Flaky:
    """A bucket over the embedded store that hands acknowledgements over as NATS does,
    and answers "unavailable" to every operation while ``down``."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.name = inner.name
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable(f"{self.name}: no stream leader")

    async def get(self, key: str) -> Entry | None:
        self._check()
        return await self.inner.get(key)

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        self._check()
        return await self.inner.create(key, value, ttl=ttl)

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        self._check()
        return await self.inner.update(key, value, expected_revision=expected_revision)

    def update_then(self, key: str, value: bytes, expected_revision: int,
                    then: Callable[[int | Exception], None]) -> bool:
        async def write() -> None:
            outcome: int | Exception
            try:
                outcome = await self.update(key, value, expected_revision=expected_revision)
            except StoreError as error:
                outcome = error
            then(outcome)

        asyncio.get_running_loop().create_task(write())
        return True

    async def put(self, key: str, value: bytes) -> int:
        return await self.inner.put(key, value)

    async def delete(self, key: str, *, expected_revision: int | None = None) -> None:
        await self.inner.delete(key, expected_revision=expected_revision)

    async def keys(self) -> list[str]:
        return await self.inner.keys()

    def watch(self) -> Watch:
        return self.inner.watch()


async def _claimed_then_store_down(
    ttl_seconds: float,
) -> tuple[ManualClock, _Flaky, TicketManager, Ticket, ProviderState]:
    """A manager with one ticket claimed, its ticket bucket then refusing every write
    (``tickets.down``), each operation tried once."""
    clock = ManualClock(1_700_000_000.0)
    kv = MemoryKV(clock)
    tickets = _Flaky(await kv.bucket("tickets"))
    states = await kv.bucket("states")
    state = provider_state(PROVIDER, usable_mib=8 * GIB)
    await states.put(KEY, state.to_json())
    manager = TicketManager(tickets, states, clock=clock, rng=random.Random(5),
                            max_attempts=1, ttl_seconds=ttl_seconds)
    ticket = await manager.claim(PROVIDER, "m", 2 * GIB, "h", provider_state=state)
    tickets.down = True
    return clock, tickets, manager, ticket, state


async def test_a_sent_release_the_store_refused_is_made_once_it_answers_again() -> None:
    """The store goes away as the release is sent: the lane's tries fail, and the
    release is tried again later (not left to the ticket's TTL) until it lands."""
    clock, tickets, manager, ticket, _state = await _claimed_then_store_down(60.0)
    outcomes: list[BaseException | None] = []
    assert manager.release_sent(PROVIDER, ticket.ticket_id, outcomes.append)
    for _ in range(400):  # the lane's own tries, each after a short pause
        await asyncio.sleep(0)
        clock.advance(0.1)
        if manager._unreleased:
            break
    assert manager._unreleased, "the refused release is to be tried again later"
    assert outcomes == []
    tickets.down = False
    for _ in range(400):
        await asyncio.sleep(0)
        clock.advance(0.5)
        if outcomes:
            break
    assert outcomes == [None]
    assert await _stored_tickets(tickets.inner) == []  # type: ignore[arg-type]
    await manager.aclose()


async def test_a_sent_release_still_refused_at_its_ttl_is_given_up() -> None:
    clock, _tickets, manager, ticket, _state = await _claimed_then_store_down(10.0)
    outcomes: list[BaseException | None] = []
    assert manager.release_sent(PROVIDER, ticket.ticket_id, outcomes.append)
    for _ in range(2000):
        await asyncio.sleep(0)
        clock.advance(0.1)
        if outcomes:
            break
    assert len(outcomes) == 1 and isinstance(outcomes[0], StoreUnavailable)
    await asyncio.sleep(0)
    assert not manager._unreleased  # nothing left trying
    await manager.aclose()


def _survived(operation: str, kind: str) -> float:
    labels = {"component": "runtime", "operation": operation, "kind": kind}
    value = metrics.REGISTRY.get_sample_value("kubemoot_errors_survived_total", labels)
    return 0.0 if value is None else value


async def test_a_release_given_up_is_counted_and_a_bug_after_it_is_survived() -> None:
    """Nobody hears a sent release fail, so the manager says it; and what the outcome's
    receiver raises (a loop callback) is counted, and the lane serves on."""
    clock, tickets, manager, ticket, state = await _claimed_then_store_down(1.0)
    failed, bugs = _survived("release", metrics.STORE), _survived("tickets", metrics.BUG)

    def broken(_error: BaseException | None) -> None:
        raise RuntimeError("a bug in the receiver")

    assert manager.release_sent(PROVIDER, ticket.ticket_id, broken)
    for _ in range(2000):
        await asyncio.sleep(0)
        clock.advance(0.1)
        if _survived("tickets", metrics.BUG) > bugs:
            break
    assert _survived("release", metrics.STORE) == failed + 1
    assert _survived("tickets", metrics.BUG) == bugs + 1
    tickets.down = False
    again = await manager.claim(PROVIDER, "m", 2 * GIB, "h2", provider_state=state)
    assert again.ticket_id in await _stored_tickets(tickets.inner)  # type: ignore[arg-type]
    await manager.aclose()
