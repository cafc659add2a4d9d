"""VRAM tickets on both stores: claim, release, renew, both release layers, races."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubemoot.clock import SystemClock
from kubemoot.runtime import ticket_decision
from kubemoot.runtime.budget import budget_allows
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.runtime.tickets import ClaimConflict, ClaimRejected, TicketGone, TicketManager
from kubemoot.store.documents import (
    ProviderTickets,
    Ticket,
    TicketState,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryBucket, MemoryKV
from kubemoot.store.protocol import Bucket, Entry
from kubemoot.testing.state import GIB, provider_state
from kubemoot.testing.waiting import until_stored
from tests.store.conftest import StoreUnderTest, make_store

PROVIDER = "gpu-a"


async def setup(
    store: StoreUnderTest,
    usable_mib: int,
    *,
    resident: dict[str, int] | None = None,
    ttl: float = 180.0,
    max_attempts: int = 8,
) -> tuple[TicketManager, Bucket, Bucket]:
    tickets = await store.bucket("tickets")
    states = await store.bucket("states")
    state = provider_state(PROVIDER, usable_mib=usable_mib, loaded=resident)
    await states.put(encode_token(PROVIDER), state.to_json())
    manager = TicketManager(
        tickets, states, clock=store.clock, ttl_seconds=ttl, max_attempts=max_attempts,
        rng=random.Random(7),
    )
    return manager, tickets, states


async def test_claim_release_and_read(store: StoreUnderTest) -> None:
    manager, _, _ = await setup(store, 24 * GIB)
    now = store.clock.now()
    ticket = await manager.claim(PROVIDER, "qwen3:8b", 6 * GIB, "crew-a/agent", evicts={})
    assert ticket.model_footprint_mib == 6 * GIB
    assert ticket.state is TicketState.RUNNING
    assert ticket.expires_at == pytest.approx(now + 180.0, abs=5)
    document, revision = await manager.read(PROVIDER)
    assert revision is not None and [t.ticket_id for t in document.tickets] == [ticket.ticket_id]
    await manager.release(PROVIDER, ticket.ticket_id)
    await manager.release(PROVIDER, ticket.ticket_id)  # idempotent
    await manager.release(PROVIDER, "never-existed")
    assert await manager.active(PROVIDER) == []


async def test_claims_beyond_the_budget_are_rejected(store: StoreUnderTest) -> None:
    manager, _, _ = await setup(store, 10 * GIB, resident={"big": 4 * GIB})
    await manager.claim(PROVIDER, "a", 4 * GIB, "h1")
    with pytest.raises(ClaimRejected, match="does not fit"):
        await manager.claim(PROVIDER, "b", 3 * GIB, "h2")
    # h2 keeps a place in line: the 2 GiB left drain to it, not to a later claimer.
    with pytest.raises(ClaimRejected, match="promised to claimers in line"):
        await manager.claim(PROVIDER, "c", 2 * GIB, "h3")
    await manager.claim(PROVIDER, "c", 2 * GIB, "h2")  # exactly fills it
    warm = await manager.claim(PROVIDER, "big", 0, "h4")  # a resident copy spends nothing
    assert warm.model_footprint_mib == 0


async def test_a_failing_check_rejects_the_claim(store: StoreUnderTest) -> None:
    manager, _, _ = await setup(store, 10 * GIB)
    seen: list[int] = []

    def no_more_than_one(provider: ProviderSnapshot) -> bool:
        seen.append(len(provider.tickets))
        return len(provider.tickets) < 1

    await manager.claim(PROVIDER, "a", GIB, "h1", check=no_more_than_one)
    with pytest.raises(ClaimRejected, match="check"):
        await manager.claim(PROVIDER, "a", GIB, "h2", check=no_more_than_one)
    assert seen[-1] == 1


async def test_a_claim_counts_the_headroom_once(
    store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refusals with a line ahead need the headroom, the ceiling and the line's promise;
    # each decision derives the provider's headroom once (it took five passes before).
    manager, _, _ = await setup(store, 10 * GIB)
    decisions: list[int] = []
    headrooms: list[int] = []
    decide, headroom = ticket_decision._refusal, ProviderSnapshot.headroom_mib

    def counted_decide(*args: object) -> object:
        decisions.append(1)
        return decide(*args)  # type: ignore[arg-type]

    def counted_headroom(self: ProviderSnapshot, evicts: object = (),
                         model: str | None = None) -> int | None:
        headrooms.append(1)
        return headroom(self, evicts, model)  # type: ignore[arg-type]

    monkeypatch.setattr(ticket_decision, "_refusal", counted_decide)
    monkeypatch.setattr(ProviderSnapshot, "headroom_mib", counted_headroom)
    first = await manager.claim(PROVIDER, "a", 8 * GIB, "h1")
    for holder in ("h2", "h3"):  # refused for memory: both wait in the line
        with pytest.raises(ClaimRejected):
            await manager.claim(PROVIDER, "b", 4 * GIB, holder)
    await manager.release(PROVIDER, first.ticket_id)
    with pytest.raises(ClaimRejected, match="promised"):  # h2 is ahead in the line
        await manager.claim(PROVIDER, "b", 8 * GIB, "h3")
    assert len(decisions) >= 4
    assert len(headrooms) == len(decisions)


async def test_renew_mark_running_and_state_changes(store: StoreUnderTest) -> None:
    manager, _, _ = await setup(store, 10 * GIB, ttl=60.0)
    held = await manager.claim(PROVIDER, "a", GIB, "h", state=TicketState.HELD)
    loading = await manager.update_state(PROVIDER, held.ticket_id, TicketState.LOADING)
    assert loading.state is TicketState.LOADING
    running = await manager.mark_running(PROVIDER, held.ticket_id)
    assert running.state is TicketState.RUNNING
    renewed = await manager.renew(PROVIDER, held.ticket_id, ttl_seconds=600.0)
    assert renewed.expires_at > held.expires_at + 500
    [stored] = await manager.active(PROVIDER)
    assert stored == renewed
    await manager.release(PROVIDER, held.ticket_id)
    with pytest.raises(TicketGone):
        await manager.renew(PROVIDER, held.ticket_id)
    with pytest.raises(TicketGone):
        await manager.mark_running(PROVIDER, held.ticket_id)


async def test_two_planners_with_the_same_victim_cannot_both_spend_it(
    store: StoreUnderTest,
) -> None:
    # A full card: the only way in is to evict "victim".
    manager, tickets, states = await setup(store, 20 * GIB, resident={"victim": 20 * GIB})
    other = TicketManager(tickets, states, clock=store.clock)  # another process's planner
    plans = [
        manager.claim(PROVIDER, "x", 20 * GIB, "planner-1", evicts={"victim": 20 * GIB},
                      state=TicketState.LOADING),
        other.claim(PROVIDER, "y", 20 * GIB, "planner-2", evicts={"victim": 20 * GIB},
                    state=TicketState.LOADING),
    ]
    outcomes = await asyncio.gather(*plans, return_exceptions=True)
    assert sum(isinstance(o, Ticket) for o in outcomes) == 1
    assert sum(isinstance(o, ClaimRejected) for o in outcomes) == 1


async def test_finally_layer_alone_returns_memory_at_once(store: StoreUnderTest) -> None:
    # The TTL is far away: only the finally release can give the memory back.
    manager, _, _ = await setup(store, 8 * GIB, ttl=3600.0)
    started = asyncio.Event()

    async def holder() -> None:
        async with manager.claimed(PROVIDER, "a", 8 * GIB, "dies"):
            started.set()
            await asyncio.Event().wait()  # the call runs until cancelled

    task = asyncio.create_task(holder())
    await started.wait()
    with pytest.raises(ClaimRejected):
        await manager.claim(PROVIDER, "b", 8 * GIB, "next")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await manager.active(PROVIDER) == []
    await manager.claim(PROVIDER, "b", 8 * GIB, "next")


async def test_finally_layer_releases_when_the_call_fails(store: StoreUnderTest) -> None:
    manager, _, _ = await setup(store, 8 * GIB, ttl=3600.0)
    with pytest.raises(RuntimeError, match="call failed"):
        async with manager.claimed(PROVIDER, "a", 8 * GIB, "h"):
            raise RuntimeError("call failed")
    assert await manager.active(PROVIDER) == []


async def test_ttl_layer_alone_returns_memory_after_the_ttl_and_not_before(
    store: StoreUnderTest,
) -> None:
    ttl = 2.0
    manager, _, _ = await setup(store, 8 * GIB, ttl=ttl)
    started = asyncio.Event()

    async def holder_without_finally() -> None:
        await manager.claim(PROVIDER, "a", 8 * GIB, "dies")  # never released
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(holder_without_finally())
    await started.wait()
    task.cancel()
    await store.age(ttl * 0.4)
    with pytest.raises(ClaimRejected):
        await manager.claim(PROVIDER, "b", 8 * GIB, "next")
    await store.age(ttl * 0.6 + 0.3)
    ticket = await manager.claim(PROVIDER, "b", 8 * GIB, "next")
    # the writer pruned the lapsed ticket
    document, _ = await manager.read(PROVIDER)
    assert [t.ticket_id for t in document.tickets] == [ticket.ticket_id]


async def test_a_cancelled_claim_leaves_no_ticket(store: StoreUnderTest) -> None:
    manager, tickets, _ = await setup(store, 8 * GIB)
    claims = [asyncio.create_task(manager.claim(PROVIDER, "a", GIB, f"h{i}")) for i in range(5)]
    await asyncio.sleep(0)
    for claim in claims:
        claim.cancel()
    await asyncio.gather(*claims, return_exceptions=True)

    async def none_left() -> bool:
        return not await manager.active(PROVIDER)

    # Orphan releases run in the background; each one is a write of the document.
    await until_stored(tickets, none_left, timeout=30, what="the orphans' release")


class HeldWrites:
    """A real bucket whose writes each wait for the test to let one through."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.name = inner.name
        self.entered = asyncio.Event()  # a write waits at the gate
        self.gate = asyncio.Event()  # set: the next write goes through
        self.landed = 0

    async def _held(self, write: Awaitable[int]) -> int:
        self.entered.set()
        await self.gate.wait()
        self.gate.clear()  # one write per opening
        revision = await write
        self.landed += 1
        return revision

    async def create(self, key: str, value: bytes) -> int:
        return await self._held(self.inner.create(key, value))

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        return await self._held(self.inner.update(key, value,
                                                  expected_revision=expected_revision))

    def __getattr__(self, attribute: str) -> object:
        return getattr(self.inner, attribute)


async def test_closing_writes_the_release_nobody_waits_for_first(
        store: StoreUnderTest) -> None:
    # A claim granted after its caller was cancelled is released in the background (so
    # is the withdrawal of an announced claim its caller heard "no" to). Nobody awaits
    # that release: a manager closed before it is written must write it first, or the
    # ticket holds its memory until the TTL.
    _manager, tickets, states = await setup(store, 8 * GIB)
    held = HeldWrites(tickets)
    manager = TicketManager(held, states, clock=store.clock,  # type: ignore[arg-type]
                            rng=random.Random(7))
    claiming = asyncio.create_task(manager.claim(PROVIDER, "a", GIB, "h"))
    await held.entered.wait()  # decided and being written: it will be granted
    claiming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claiming
    held.entered.clear()
    held.gate.set()  # the grant lands; the orphan's release is queued
    await held.entered.wait()  # and held at the gate
    closing = asyncio.create_task(manager.aclose())
    landed_when_closed: list[int] = []
    closing.add_done_callback(lambda _: landed_when_closed.append(held.landed))
    for _ in range(20):  # every chance to return early
        await asyncio.sleep(0)
    held.gate.set()
    await closing
    assert landed_when_closed == [2]  # the grant, then the release
    assert await manager.active(PROVIDER) == []


async def test_one_process_batches_its_claims_into_few_writes(store: StoreUnderTest) -> None:
    manager, tickets, _ = await setup(store, 100 * GIB)
    watch = tickets.watch()
    await watch.ready()
    granted = await asyncio.gather(*(manager.claim(PROVIDER, "m", GIB, f"h{i}")
                                     for i in range(20)))
    assert len({t.ticket_id for t in granted}) == 20
    assert len(await manager.active(PROVIDER)) == 20
    # Count the writes up to the last one (its revision is the document's now), not
    # until a quiet spell: a slow machine cannot make a quiet spell come early.
    final = await tickets.get(encode_token(PROVIDER))
    assert final is not None
    writes = 0
    async with asyncio.timeout(30):
        async for change in watch:
            writes += 1
            if change.revision >= final.revision:
                break
    assert 1 <= writes < 20
    await watch.aclose()


class RivalBucket:
    """A real bucket where a rival writes the key between every read and write."""

    def __init__(self, inner: MemoryBucket) -> None:
        self.inner = inner
        self.name = inner.name

    async def get(self, key: str) -> Entry | None:
        entry = await self.inner.get(key)
        if entry is not None:
            await self.inner.put(key, entry.value)  # the rival's write
        return entry

    def __getattr__(self, attribute: str) -> object:
        return getattr(self.inner, attribute)


async def test_claim_conflict_after_bounded_attempts() -> None:
    store = await make_store("memory", None)
    tickets = await store.kv.bucket("tickets")
    states = await store.kv.bucket("states")
    await states.put(encode_token(PROVIDER), provider_state(PROVIDER, usable_mib=8 * GIB).to_json())
    await tickets.put(encode_token(PROVIDER), ProviderTickets(provider=PROVIDER).to_json())
    rival = RivalBucket(tickets)  # type: ignore[arg-type]
    manager = TicketManager(rival, states, clock=store.clock, max_attempts=3)  # type: ignore[arg-type]
    with pytest.raises(ClaimConflict, match="3 compare-and-set races"):
        await manager.claim(PROVIDER, "a", GIB, "h")


# -- racing claimers: the invariant at every committed revision ----------------------


async def race(store: StoreUnderTest, usable: int, footprints: list[int], managers: int,
               rounds: int, *, with_state: bool = False, announce: bool = False) -> int:
    """Claimers race on one provider; returns overcommits seen (must be 0).

    ``with_state``: claimers pass the provider state they hold, as the runtime does.
    ``announce``: the managers announce lost races and apply each other's (the claim
    line across processes).
    """
    tickets = await store.bucket("tickets")
    states = await store.bucket("states")
    requests = await store.bucket("requests") if announce else None
    state = provider_state(PROVIDER, usable_mib=usable)
    await states.put(encode_token(PROVIDER), state.to_json())
    watch = tickets.watch()
    await watch.ready()
    pool = [TicketManager(tickets, states, clock=store.clock, rng=random.Random(i),
                          max_attempts=50, requests=requests) for i in range(managers)]
    for manager in pool:
        await manager.open()
    held = 0
    overcommits = 0
    last_seen = 0  # the newest revision the checker has looked at
    seen = asyncio.Condition()  # notified at each revision the checker takes
    # Every claimer holds what it got until all have tried in this round: the claims of
    # a round overlap on any store and any machine, so a budget that let too much
    # through is committed side by side, never hidden by a quick release.
    everyone_tried = asyncio.Barrier(len(footprints))

    async def claimer(index: int, footprint: int) -> None:
        nonlocal held, overcommits
        manager = pool[index % managers]
        for _ in range(rounds):
            try:
                ticket = await manager.claim(PROVIDER, f"m{index}", footprint, f"h{index}",
                                             provider_state=state if with_state else None)
            except ClaimRejected:
                await everyone_tried.wait()
                continue
            held += footprint
            if held > usable:
                overcommits += 1
            await everyone_tried.wait()
            held -= footprint
            await manager.release(PROVIDER, ticket.ticket_id)

    async def claimer_or_break(index: int, footprint: int) -> None:
        try:
            await claimer(index, footprint)
        except BaseException:
            everyone_tried.abort()  # the others must not wait for a claimer that failed
            raise

    async def check_every_revision() -> None:
        nonlocal overcommits, last_seen
        async for change in watch:
            async with seen:
                last_seen = max(last_seen, change.revision)
                seen.notify_all()
            if change.value is None:
                continue
            document = ProviderTickets.from_json(change.value)
            active = document.active(store.clock.now())
            # the committed tickets must fit: remove each and it must have fitted beside the rest
            spent = sum(t.model_footprint_mib for t in active)
            if spent > usable or not all(
                budget_allows(state, [o for o in active if o is not t], store.clock.now(),
                              footprint_mib=t.model_footprint_mib)
                for t in active
            ):
                overcommits += 1

    ended = False  # the checker stopped (its watch ended, or it failed)

    async def check_then_say_so() -> None:
        nonlocal ended
        try:
            await check_every_revision()
        finally:
            async with seen:
                ended = True
                seen.notify_all()

    checker = asyncio.create_task(check_then_say_so())
    await asyncio.gather(*(claimer_or_break(i, f) for i, f in enumerate(footprints)))
    # Close the watch only once the checker has seen the document's final revision: a
    # fixed pause could close it before late revisions arrive on a loaded machine.
    final = await tickets.get(encode_token(PROVIDER))
    if final is not None:
        try:
            async with seen, asyncio.timeout(30):
                await seen.wait_for(lambda: last_seen >= final.revision or ended)
        except TimeoutError:
            raise AssertionError("the watch missed the final revision") from None
    await watch.aclose()
    await checker
    for manager in pool:
        await manager.aclose()
    assert await TicketManager(tickets, states, clock=store.clock).active(PROVIDER) == []
    return overcommits


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    usable=st.integers(min_value=1, max_value=40).map(lambda g: g * GIB),
    footprints=st.lists(st.integers(min_value=0, max_value=16 * GIB), min_size=2, max_size=12),
    managers=st.integers(min_value=1, max_value=4),
    with_state=st.booleans(),
)
async def test_racing_claimers_never_overcommit_memory_store(
    usable: int, footprints: list[int], managers: int, with_state: bool
) -> None:
    store = await make_store("memory", None)
    assert await race(store, usable, footprints, managers, rounds=5,
                      with_state=with_state) == 0


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    usable=st.integers(min_value=4, max_value=24).map(lambda g: g * GIB),
    footprints=st.lists(st.integers(min_value=1, max_value=8).map(lambda g: g * GIB),
                        min_size=6, max_size=10),
)
async def test_racing_claimers_never_overcommit_nats(
    nats_url: str, usable: int, footprints: list[int]
) -> None:
    # separate connections: every manager is a "process" of its own
    stores = [await make_store("nats", nats_url) for _ in range(3)]
    try:
        tickets = await stores[0].bucket("tickets")
        states = await stores[0].bucket("states")
        state = provider_state(PROVIDER, usable_mib=usable)
        await states.put(encode_token(PROVIDER), state.to_json())
        pool = [
            TicketManager(await s.kv.bucket(tickets.name), await s.kv.bucket(states.name),
                          clock=s.clock, rng=random.Random(i), max_attempts=50)
            for i, s in enumerate(stores)
        ]
        held = 0
        overcommits = 0
        # the workload: hold the memory until every claimer has tried in this round, so
        # the round's grants overlap however fast or slow the round trips are
        everyone_tried = asyncio.Barrier(len(footprints))

        async def claimer(index: int, footprint: int) -> None:
            nonlocal held, overcommits
            for _ in range(4):
                try:
                    ticket = await pool[index % 3].claim(PROVIDER, "m", footprint, f"h{index}")
                except ClaimRejected:
                    await everyone_tried.wait()
                    continue
                held += footprint
                overcommits += held > usable
                await everyone_tried.wait()
                held -= footprint
                await pool[index % 3].release(PROVIDER, ticket.ticket_id)

        async def claimer_or_break(index: int, footprint: int) -> None:
            try:
                await claimer(index, footprint)
            except BaseException:
                everyone_tried.abort()  # nobody waits for a claimer that failed
                raise

        await asyncio.gather(*(claimer_or_break(i, f) for i, f in enumerate(footprints)))
        assert overcommits == 0
        assert await pool[0].active(PROVIDER) == []
    finally:
        for s in stores:
            await s.kv.close()


@pytest.mark.parametrize("announce", [False, True], ids=["racing", "claim-line"])
@pytest.mark.parametrize("with_state", [False, True], ids=["reading-state", "callers-state"])
async def test_racing_claimers_on_nats_checked_at_every_revision(
    nats_url: str, with_state: bool, announce: bool
) -> None:
    store = await make_store("nats", nats_url)
    try:
        assert await race(store, 12 * GIB, [4 * GIB, 5 * GIB, 3 * GIB, 6 * GIB, 2 * GIB,
                                            7 * GIB], managers=3, rounds=6,
                          with_state=with_state, announce=announce) == 0
    finally:
        await store.kv.close()


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    usable=st.integers(min_value=1, max_value=40).map(lambda g: g * GIB),
    footprints=st.lists(st.integers(min_value=0, max_value=16 * GIB), min_size=2, max_size=12),
    managers=st.integers(min_value=2, max_value=4),
)
async def test_racing_claimers_with_the_claim_line_never_overcommit_memory_store(
    usable: int, footprints: list[int], managers: int
) -> None:
    # The wall clock: an announcer waits for another manager's write or a short
    # backoff, and a manual clock moves only when someone sleeps on it.
    clock = SystemClock()

    async def no_time(seconds: float) -> None:
        raise AssertionError("this race lets no time pass")

    store = StoreUnderTest("memory", MemoryKV(clock), clock, no_time, no_time)
    assert await race(store, usable, footprints, managers, rounds=5, announce=True) == 0

