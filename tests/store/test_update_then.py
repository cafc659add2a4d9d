"""A compare-and-set whose outcome the NATS store hands over as it reads the ack.

``NatsBucket.update_then`` sends what ``update`` sends and gives a function what
``update`` would return or raise, from the connection's read loop (or the timeout's
timer) instead of waking a task that awaits it. The embedded store does not offer it:
its writers keep their loop turns, which the simulator's decisions follow.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubemoot import metrics
from kubemoot.settings import NatsSettings
from kubemoot.store.memory import MemoryKV
from kubemoot.store.nats import NatsBucket, NatsKV, _Client
from kubemoot.store.protocol import HandingBucket, RevisionMismatch, StoreUnavailable
from kubemoot.testing.waiting import wait_until


class Heard:
    """What a ``then`` was given, and in which task."""

    def __init__(self) -> None:
        self.outcomes: list[int | Exception] = []
        self.tasks: list[asyncio.Task[Any] | None] = []

    def __call__(self, outcome: int | Exception) -> None:
        self.outcomes.append(outcome)
        self.tasks.append(asyncio.current_task())

    async def one(self, timeout: float = 10.0) -> int | Exception:
        await wait_until(lambda: bool(self.outcomes), timeout=timeout,
                         what="the outcome handed over")
        assert len(self.outcomes) == 1
        return self.outcomes[0]


async def _bucket(kv: NatsKV, name: str) -> NatsBucket:
    bucket = await kv.bucket(name)
    assert isinstance(bucket, NatsBucket)
    return bucket


async def test_the_outcome_is_what_update_would_give_from_the_read_loop(nats_url: str) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await _bucket(kv, "then_outcome")
        first = await bucket.put("k", b"one")
        heard = Heard()
        assert bucket.update_then("k", b"two", first, heard)
        assert heard.outcomes == []  # never from the call itself
        second = await heard.one()
        entry = await bucket.get("k")
        assert entry is not None and (entry.value, entry.revision) == (b"two", second)
        # handed over in the connection's read loop: no task of its own woke for it
        assert heard.tasks == [kv.connection._reading_task]
        lost = Heard()
        assert bucket.update_then("k", b"three", first, lost)
        assert isinstance(await lost.one(), RevisionMismatch)
        entry = await bucket.get("k")
        assert entry is not None and entry.value == b"two"
        assert kv._acks is not None and kv._acks._waiting == {}
    finally:
        await kv.close()


async def test_what_cannot_be_sent_at_once_is_refused_with_nothing_sent(
    nats_url: str,
) -> None:
    """A key ``update`` refuses, or commands queued for nats-py's flusher (which must
    go first): False, and the caller awaits ``update`` instead."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await _bucket(kv, "then_refused")
        first = await bucket.put("k", b"one")
        connection = kv.connection
        assert isinstance(connection, _Client)
        heard = Heard()
        sent = connection.stats["out_msgs"]
        for key in ("", ".k", "k.", "a key", "k*"):
            assert not bucket.update_then(key, b"v", first, heard)
        await connection.publish("$KV.then_refused.k", b"queued")
        assert connection._pending_data_size > 0
        assert not bucket.update_then("k", b"two", first, heard)
        assert connection.stats["out_msgs"] == sent + 1  # the queued publish only
        await asyncio.sleep(0.1)
        assert heard.outcomes == []
        assert kv._acks is not None and kv._acks._waiting == {}
        entry = await bucket.get("k")
        assert entry is not None and entry.value == b"queued"
    finally:
        await kv.close()


async def test_with_no_stream_left_the_outcome_is_unavailable(nats_url: str) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await _bucket(kv, "then_gone")
        revision = await bucket.put("k", b"one")
        await kv.connection.jetstream().delete_stream("KV_then_gone")
        heard = Heard()
        assert bucket.update_then("k", b"two", revision, heard)
        assert isinstance(await heard.one(), StoreUnavailable)
    finally:
        await kv.close()


async def test_nobody_answering_in_time_is_unavailable_after_the_request_timeout(
    nats_url: str,
) -> None:
    """A subscriber that never replies stands where the stream was: the timer hands
    over the timeout, and nothing is left waiting."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url], request_timeout=0.3))
    try:
        bucket = await _bucket(kv, "then_silent")
        revision = await bucket.put("k", b"one")
        await kv.connection.jetstream().delete_stream("KV_then_silent")
        silent = await kv.connection.subscribe("$KV.then_silent.k")
        await kv.connection.flush()
        loop = asyncio.get_running_loop()
        started = loop.time()
        heard = Heard()
        assert bucket.update_then("k", b"two", revision, heard)
        assert isinstance(await heard.one(), StoreUnavailable)
        assert 0.25 <= loop.time() - started < 5.0
        assert kv._acks is not None and kv._acks._waiting == {}
        await silent.unsubscribe()
    finally:
        await kv.close()


def _survived_update_bugs() -> float:
    labels = {"component": "store", "operation": "update", "kind": metrics.BUG}
    value = metrics.REGISTRY.get_sample_value("kubemoot_errors_survived_total", labels)
    return 0.0 if value is None else value


async def test_a_then_that_raises_is_counted_and_the_connection_reads_on(
    nats_url: str,
) -> None:
    """Raised into nats-py's read loop, it would stop the connection's reading."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await _bucket(kv, "then_raises")
        revision = await bucket.put("k", b"one")
        before = _survived_update_bugs()
        raised: list[int | Exception] = []

        def broken(outcome: int | Exception) -> None:
            raised.append(outcome)
            raise RuntimeError("a bug in the function handed the outcome")

        assert bucket.update_then("k", b"two", revision, broken)
        await wait_until(lambda: bool(raised), timeout=10, what="the outcome handed over")
        assert _survived_update_bugs() == before + 1
        assert isinstance(raised[0], int)
        assert await bucket.update("k", b"three", expected_revision=raised[0]) > raised[0]
    finally:
        await kv.close()


async def test_the_embedded_store_hands_nothing_over() -> None:
    """Its writers keep the loop turns of awaiting ``update``."""
    kv = MemoryKV()
    bucket = await kv.bucket("then_embedded")
    assert not isinstance(bucket, HandingBucket)
    await kv.close()


async def test_writes_handed_over_share_the_one_timer(
    nats_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write handed over arms no timer of its own (the store's one timer stands at the
    earliest deadline), and none is left waiting."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await _bucket(kv, "then_timer")
        revision = await bucket.put("k", b"0")
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        call_at = loop.call_at

        def counted_at(when: float, callback: Any, *args: Any,
                       **kwargs: Any) -> asyncio.TimerHandle:
            if getattr(callback, "__self__", None) is kv._acks:  # not the test's waits
                armed.append(when)
            return call_at(when, callback, *args, **kwargs)

        monkeypatch.setattr(loop, "call_at", counted_at)
        for i in range(20):
            heard = Heard()
            assert bucket.update_then("k", b"%d" % i, revision, heard)
            outcome = await heard.one()
            assert isinstance(outcome, int)
            revision = outcome
        assert len(armed) <= 1
        assert kv._acks is not None and kv._acks._waiting == {}
    finally:
        await kv.close()
