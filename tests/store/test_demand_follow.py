"""A demand board that follows its bucket answers what a board that reads it answers.

The follower keeps a watched copy (``runtime/demand_follow.py``); the simulator's
decisions depend on it giving the same figures in the same loop turns as the plain
read, so these tests run both side by side on one embedded bucket, through drawn
writes, deletions, unreadable entries, expiries and writes that land while a read is
under way, and compare every snapshot.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from kubemoot.clock import ManualClock
from kubemoot.runtime.demand import FORECAST_REFRESH_SECONDS, FULL_READ_SECONDS, DemandBoard
from kubemoot.runtime.snapshot import DemandSnapshot
from kubemoot.settings import RuntimeSettings
from kubemoot.store import _watch
from kubemoot.store.documents import DemandEntry
from kubemoot.store.memory import MemoryBucket, MemoryKV
from kubemoot.store.protocol import Change, ChangesLost, Entry
from tests.store.conftest import StoreUnderTest

MODELS = ("qwen3:8b", "qwen3:14b", "qwen3:32b", "llama3.1:8b")
AGENTS = tuple(f"crew-{c}/agent-{a}" for c in "ab" for a in range(4))
SETTINGS = RuntimeSettings(demand_wait_ttl_seconds=40.0, demand_intent_ttl_seconds=25.0,
                           demand_use_window_seconds=30.0, selection_window_seconds=90.0)


class CountingBucket(MemoryBucket):
    """An embedded bucket that counts the listings and reads of its keys."""

    def __init__(self, clock: ManualClock, *, max_age: float | None = None) -> None:
        super().__init__("demand", clock=clock, max_age=max_age)
        self.listings = 0
        self.reads = 0

    async def keys(self) -> list[str]:
        self.listings += 1
        return await super().keys()

    async def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        self.reads += 1
        return await super().get_many(keys)


def _figures(snapshot: DemandSnapshot) -> dict[str, tuple[object, ...]]:
    return {m: (d.waiters, d.intents, d.recent_use, d.prediction, d.last_used_at)
            for m, d in snapshot.models.items()}


async def _write(rng: random.Random, writer: DemandBoard, bucket: MemoryBucket,
                 clock: ManualClock) -> None:
    model, agent = rng.choice(MODELS), rng.choice(AGENTS)
    action = rng.randrange(10)
    if action == 0:
        await writer.add_waiter(model, agent)
    elif action == 1:
        await writer.remove_waiter(model, agent)
    elif action == 2:
        await writer.add_intent(model, agent)
    elif action == 3:
        await writer.remove_intent(model, agent)
    elif action == 4:
        await writer.record_use(model)
    elif action == 5:
        await writer.record_selection(agent, rng.sample(MODELS, rng.randint(1, 3)),
                                      rng.choice((0.1, 0.25, 1 / 3, 0.5)))
    elif action == 6:  # a value or key this version cannot read, written and later fixed
        await bucket.put(rng.choice(("wait.bad", "use.%zz", "sel.x", "other")), b"{not json")
    elif action == 7:
        await bucket.delete(rng.choice(("wait.bad", "use.%zz", "sel.x", "other")))
    else:
        clock.advance(rng.choice((0.5, 3.0, 11.0, 29.0, 61.0)))


@pytest.mark.parametrize("seed", range(6))
async def test_a_following_board_answers_what_a_reading_board_answers(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(start=1_000.0)
    # a short bucket age: the store drops entries the follower's watch never hears of
    bucket = CountingBucket(clock, max_age=200.0 if seed % 2 else None)
    writer = DemandBoard(bucket, clock=clock, settings=SETTINGS)
    reader = DemandBoard(bucket, clock=clock, settings=SETTINGS)
    follower = DemandBoard(bucket, clock=clock, settings=SETTINGS)
    assert await follower.follow()
    for _step in range(400):
        for _ in range(rng.randint(0, 4)):
            await _write(rng, writer, bucket, clock)
        if rng.random() < 0.3 and not seed % 2:
            # Writes that land while both reads are under way, a turn apart. (Not with
            # a bucket age: a key the store let expire and that is written again during
            # a read counts in the follower's copy, which has not seen it expire, and
            # not in the reader's listing; the runtime's bucket age, 6 h, outlives
            # every entry's own lifetime, after which no reader counts it.)
            async def meanwhile() -> None:
                for _ in range(rng.randint(1, 3)):
                    await _write(rng, writer, bucket, clock)
                    await asyncio.sleep(0)

            read, followed, _ = await asyncio.gather(
                reader.snapshot(), follower.snapshot(), meanwhile())
        else:
            read, followed = await reader.snapshot(), await follower.snapshot()
        assert _figures(followed) == _figures(read)
        assert followed.at == read.at
    await follower.close()


async def test_a_following_board_lists_its_bucket_only_for_a_full_read() -> None:
    clock = ManualClock(start=0.0)
    bucket = CountingBucket(clock)
    board = DemandBoard(bucket, clock=clock)  # entries live 180 s
    assert await board.follow()
    await board.add_waiter("qwen3:8b", "crew-a/critic")
    await board.snapshot()  # the first read fills the copy
    assert (bucket.listings, bucket.reads) == (1, 1)
    for _ in range(10):
        await board.add_intent("qwen3:14b", "crew-a/planner")
        snapshot = await board.snapshot()
        clock.advance(FULL_READ_SECONDS / 40)
    assert (snapshot.of("qwen3:8b").waiters, snapshot.of("qwen3:14b").intents) == (1, 1)
    assert (bucket.listings, bucket.reads) == (1, 1)
    clock.advance(FULL_READ_SECONDS)
    await board.snapshot()
    assert (bucket.listings, bucket.reads) == (2, 2)
    await board.close()


async def test_a_following_board_lists_an_empty_bucket_once() -> None:
    # An empty board is a copy like any other: listing it again on every read (as the
    # follower did) cost a NATS consumer a second for nothing. What is written after
    # the listing reaches the copy through the watch.
    clock = ManualClock(start=0.0)
    bucket = CountingBucket(clock)
    board = DemandBoard(bucket, clock=clock)
    assert await board.follow()
    for _ in range(5):
        assert (await board.snapshot()).demand("qwen3:8b") == 0.0
        clock.advance(1.0)
    assert (bucket.listings, bucket.reads) == (1, 0)
    writer = DemandBoard(bucket, clock=clock)
    await writer.add_waiter("qwen3:8b", "crew-a/critic")
    assert (await board.snapshot()).of("qwen3:8b").waiters == 1
    assert (bucket.listings, bucket.reads) == (1, 0)
    await board.close()


async def test_a_board_whose_store_closed_reads_again() -> None:
    kv = MemoryKV(ManualClock())
    board = DemandBoard(await kv.bucket("demand"), clock=ManualClock(), settings=SETTINGS)
    assert await board.follow()
    await board.add_waiter("qwen3:8b", "crew-a/critic")
    assert (await board.snapshot()).of("qwen3:8b").waiters == 1
    await kv.close()
    with pytest.raises(Exception, match="closed"):
        await board.snapshot()  # the plain read's error, not a stale copy


async def test_a_watch_drains_what_is_pending_and_then_its_end() -> None:
    kv = MemoryKV(ManualClock())
    bucket = await kv.bucket("b")
    watch = bucket.watch()
    assert watch.drain() == []
    await bucket.put("a", b"1")
    await bucket.delete("a")
    assert [(c.key, c.value) for c in watch.drain() or []] == [("a", b"1"), ("a", None)]
    await bucket.put("b", b"2")
    await kv.close()
    changes = watch.drain()
    assert changes == [Change("b", "b", b"2", 3)]
    assert watch.drain() is None
    assert watch.drain() is None
    with pytest.raises(StopAsyncIteration):
        await watch.__anext__()


async def test_a_drained_watch_forgets_past_its_bound_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_watch, "DRAINED_BOUND", 3)
    kv = MemoryKV(ManualClock())
    bucket = await kv.bucket("b")
    watch = bucket.watch()
    for n in range(3):  # never drained yet: an iterated watch keeps everything
        await bucket.put(f"k{n}", b"v")
    assert len(watch.drain() or []) == 3
    for n in range(5):
        await bucket.put(f"k{n}", b"w")
    with pytest.raises(ChangesLost):
        watch.drain()
    assert [c.key for c in watch.drain() or []] == ["k3", "k4"]  # what came after the loss


async def test_a_board_that_lost_changes_reads_its_bucket_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_watch, "DRAINED_BOUND", 4)
    clock = ManualClock(start=0.0)
    bucket = CountingBucket(clock)
    writer = DemandBoard(bucket, clock=clock)
    follower = DemandBoard(bucket, clock=clock)
    assert await follower.follow()
    await writer.add_waiter("qwen3:8b", "crew-a/critic")
    await follower.snapshot()
    for agent in AGENTS:  # more changes than the watch keeps, with nobody reading
        await writer.add_intent("qwen3:14b", agent)
    await writer.remove_waiter("qwen3:8b", "crew-a/critic")
    assert bucket.listings == 1
    snapshot = await follower.snapshot()  # the loss shows: the board reads it whole
    assert bucket.listings == 2
    assert snapshot.of("qwen3:14b").intents == len(AGENTS)
    assert snapshot.of("qwen3:8b").waiters == 0


async def test_a_following_board_keeps_up_on_both_stores(store: StoreUnderTest) -> None:
    bucket = await store.bucket("demand")
    writer = DemandBoard(bucket, clock=store.clock)
    follower = DemandBoard(bucket, clock=store.clock)
    await writer.add_waiter("qwen3:8b", "crew-a/critic")  # before the watch: the first
    assert await follower.follow()  # read fetches it
    assert (await follower.snapshot()).of("qwen3:8b").waiters == 1
    await writer.add_intent("qwen3:14b", "crew-a/planner")
    await writer.remove_waiter("qwen3:8b", "crew-a/critic")
    # a NATS watch delivers a moment later; the memory store's at once
    for _ in range(200):
        snapshot = await follower.snapshot()
        if snapshot.of("qwen3:14b").intents == 1 and snapshot.of("qwen3:8b").waiters == 0:
            break
        await asyncio.sleep(0.05)
    assert (snapshot.of("qwen3:14b").intents, snapshot.of("qwen3:8b").waiters) == (1, 0)
    await follower.close()


async def test_a_board_read_again_at_the_same_instant() -> None:
    """Read again at the same instant with nothing changed, the following board gives
    the snapshot it gave; a change in between (its own selections included) or a later
    instant counts afresh, as a reading board does."""
    clock = ManualClock(start=1_000.0)
    bucket = CountingBucket(clock)
    follower = DemandBoard(bucket, clock=clock, settings=SETTINGS)
    assert await follower.follow()
    await follower.add_waiter("qwen3:8b", "crew-a/agent-0")
    await follower.record_use("qwen3:8b")
    await follower.snapshot()  # the first read fills the copy from the bucket
    first = await follower.snapshot()
    again = await follower.snapshot()
    assert again is first

    async def both() -> DemandSnapshot:
        # a new reader each time: it reads the forecast too, which the follower's own
        # selections change at once
        reader = DemandBoard(bucket, clock=clock, settings=SETTINGS)
        followed, read = await follower.snapshot(), await reader.snapshot()
        assert _figures(followed) == _figures(read)
        return followed

    await follower.add_intent("qwen3:14b", "crew-a/agent-1")  # the same instant
    changed = await both()
    assert changed is not first and changed.of("qwen3:14b").intents == 1
    await follower.record_selection("crew-a/agent-2", ["qwen3:32b"], 0.5)
    selected = await both()
    assert selected.of("qwen3:32b").prediction == 0.5
    await follower.remove_waiter("qwen3:8b", "crew-a/agent-0")
    assert (await both()).of("qwen3:8b").waiters == 0
    clock.advance(3.0)
    later = await both()
    assert later.of("qwen3:8b").recent_use < selected.of("qwen3:8b").recent_use
    await follower.close()


async def test_catching_up_on_an_older_revision_keeps_the_newer_parse(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A board that wrote a key twice between two reads parses only the older revision
    when its copy catches up: its own newer write stays parsed."""
    clock = ManualClock(start=1_000.0)
    bucket = CountingBucket(clock)
    board = DemandBoard(bucket, clock=clock, settings=SETTINGS)
    assert await board.follow()
    await board.snapshot()  # the first read fills the copy
    parsed: list[bytes] = []
    parse = DemandEntry.from_json

    def counted(value: bytes) -> DemandEntry:
        parsed.append(value)
        return parse(value)

    monkeypatch.setattr(DemandEntry, "from_json", counted)
    await board.record_use("qwen3:8b")
    await board.record_use("qwen3:8b")  # reads back its own first write: no parse
    assert parsed == []
    snapshot = await board.snapshot()  # the copy meets both revisions
    assert snapshot.of("qwen3:8b").recent_use == pytest.approx(2.0)
    assert len(parsed) == 1  # the first; the second is the board's own, kept
    await board.close()


async def test_a_forecast_with_no_entry_changed_is_not_summed_again() -> None:
    """A following board's forecast, due again with no forecast entry changed and none
    expired, is the sums it worked out before; another writer's selection, its own, a
    removed entry or an expired one make it sum afresh, as a reading board does."""
    clock = ManualClock(start=1_000.0)
    bucket = CountingBucket(clock)
    settings = RuntimeSettings(selection_window_seconds=200.0)  # how long entries live
    follower = DemandBoard(bucket, clock=clock, settings=settings)
    assert await follower.follow()
    writer = DemandBoard(bucket, clock=clock, settings=settings)
    await writer.record_selection("crew-a/agent-0", ["qwen3:8b", "qwen3:14b"], 0.25)
    await follower.record_selection("crew-a/agent-1", ["qwen3:8b"], 0.5)

    async def both() -> dict[str, float]:
        reader = DemandBoard(bucket, clock=clock, settings=settings)
        followed, read = await follower.snapshot(), await reader.snapshot()
        assert _figures(followed) == _figures(read)
        assert follower._forecast is not None
        return follower._forecast[1]

    first = await both()
    assert first == {"qwen3:8b": 0.75, "qwen3:14b": 0.25}
    clock.advance(FORECAST_REFRESH_SECONDS)  # due again, nothing changed
    assert await both() is first
    await writer.record_selection("crew-a/agent-2", ["qwen3:32b"], 1.0)
    clock.advance(FORECAST_REFRESH_SECONDS)
    other = await both()
    assert other is not first and other["qwen3:32b"] == 1.0
    await follower.record_selection("crew-a/agent-1", ["qwen3:14b"], 0.5)
    clock.advance(FORECAST_REFRESH_SECONDS)
    own = await both()
    assert own is not other and own == {"qwen3:8b": 0.25, "qwen3:14b": 0.75, "qwen3:32b": 1.0}
    await bucket.delete("sel.crew-a=2Fagent-2")
    clock.advance(FORECAST_REFRESH_SECONDS)
    removed = await both()
    assert "qwen3:32b" not in removed
    clock.advance(FORECAST_REFRESH_SECONDS / 2)  # within the window: the same forecast
    assert await both() is removed
    clock.advance(70.0)  # past agent-0's expiry (200 s after it was written): afresh
    expired = await both()
    assert expired is not removed and expired == {"qwen3:14b": 0.5}
    await follower.close()


async def test_a_full_read_folds_only_what_the_watch_did_not_bring() -> None:
    """The periodic full read finds the entries the copy holds at the same revisions:
    it folds none of them again (only keys changed behind the watch's back would be)."""
    clock = ManualClock(start=1_000.0)
    bucket = CountingBucket(clock)
    follower = DemandBoard(bucket, clock=clock, settings=SETTINGS)
    assert await follower.follow()
    writer = DemandBoard(bucket, clock=clock, settings=SETTINGS)
    for agent in AGENTS:
        await writer.add_intent("qwen3:8b", agent)
    await writer.record_selection(AGENTS[0], ["qwen3:8b"], 0.5)
    await follower.snapshot()  # the first read fills the copy
    mirror = follower._mirror
    assert mirror is not None
    folded: list[str] = []
    fold = mirror._fold

    def counted(key: str, revision: int, value: bytes) -> tuple[str, tuple[str, ...], object]:
        folded.append(key)
        return fold(key, revision, value)

    mirror._fold = counted  # type: ignore[assignment]  # counts, then folds as before
    clock.advance(FULL_READ_SECONDS)
    await writer.record_use("qwen3:8b")
    listings = bucket.listings
    read = await follower.snapshot()
    assert bucket.listings == listings + 1  # a full read
    assert folded == ["use.qwen3=3A8b"]  # the one new entry, from the watch
    reader = DemandBoard(bucket, clock=clock, settings=SETTINGS)
    assert _figures(read) == _figures(await reader.snapshot())
    await follower.close()
