"""One contract suite for both stores: the embedded one and NATS JetStream KV."""

from __future__ import annotations

import asyncio

import pytest

from kubemoot.settings import NatsSettings
from kubemoot.store import open_store
from kubemoot.store.memory import MemoryKV
from kubemoot.store.nats import NatsKV
from kubemoot.store.protocol import (
    KV,
    Bucket,
    Change,
    KeyExists,
    RevisionMismatch,
    StoreUnavailable,
    Watch,
)
from kubemoot.testing.waiting import until_stored
from tests.store.conftest import StoreUnderTest


async def next_change(watch: Watch, timeout: float = 5.0) -> Change:
    return await asyncio.wait_for(watch.__anext__(), timeout)


async def test_get_of_an_absent_key_is_none(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    assert await bucket.get("missing") is None


async def test_get_many_answers_in_order_what_one_get_per_key_answers(
    store: StoreUnderTest,
) -> None:
    bucket = await store.bucket("c")
    await bucket.put("a", b"one")
    second = await bucket.put("b", b"two")
    await bucket.put("gone", b"three")
    await bucket.delete("gone")
    keys = ["b", "missing", "a", "gone", "b"]
    many = await bucket.get_many(keys)
    assert many == [await bucket.get(k) for k in keys]
    assert [e.value if e else None for e in many] == [b"two", None, b"one", None, b"two"]
    assert many[0] is not None and many[0].revision == second
    assert await bucket.get_many([]) == []


async def test_get_many_after_a_change_reads_the_new_revision(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    first = await bucket.put("k", b"one")
    assert [e.revision for e in await bucket.get_many(["k"]) if e] == [first]
    second = await bucket.update("k", b"two", expected_revision=first)
    assert [(e.value, e.revision) for e in await bucket.get_many(["k"]) if e] == [
        (b"two", second)
    ]


async def test_create_then_get_returns_value_and_revision(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    revision = await bucket.create("k", b"one")
    entry = await bucket.get("k")
    assert entry is not None
    assert (entry.key, entry.value, entry.revision) == ("k", b"one", revision)


async def test_create_on_a_present_key_raises_key_exists(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    await bucket.create("k", b"one")
    with pytest.raises(KeyExists):
        await bucket.create("k", b"two")
    entry = await bucket.get("k")
    assert entry is not None and entry.value == b"one"


async def test_update_at_the_expected_revision_moves_it_forward(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    first = await bucket.create("k", b"one")
    second = await bucket.update("k", b"two", expected_revision=first)
    assert second > first
    entry = await bucket.get("k")
    assert entry is not None and (entry.value, entry.revision) == (b"two", second)


@pytest.mark.parametrize("stale", [True, False], ids=["stale-revision", "absent-key"])
async def test_update_off_revision_raises_revision_mismatch(
    store: StoreUnderTest, stale: bool
) -> None:
    bucket = await store.bucket("c")
    if stale:
        first = await bucket.create("k", b"one")
        await bucket.update("k", b"two", expected_revision=first)
        expected = first
    else:
        expected = 7
    with pytest.raises(RevisionMismatch):
        await bucket.update("k", b"three", expected_revision=expected)
    entry = await bucket.get("k")
    assert (entry.value if entry else None) == (b"two" if stale else None)


async def test_put_writes_unconditionally(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    first = await bucket.put("k", b"one")
    second = await bucket.put("k", b"two")
    assert second > first
    entry = await bucket.get("k")
    assert entry is not None and entry.value == b"two"


async def test_delete_is_idempotent_and_allows_create_again(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    await bucket.create("k", b"one")
    await bucket.delete("k")
    await bucket.delete("k")
    await bucket.delete("never-there")
    assert await bucket.get("k") is None
    assert await bucket.keys() == []
    revision = await bucket.create("k", b"again")
    entry = await bucket.get("k")
    assert entry is not None and (entry.value, entry.revision) == (b"again", revision)


async def test_delete_with_a_stale_revision_keeps_the_value(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    first = await bucket.create("k", b"one")
    second = await bucket.update("k", b"two", expected_revision=first)
    with pytest.raises(RevisionMismatch):
        await bucket.delete("k", expected_revision=first)
    await bucket.delete("k", expected_revision=second)
    assert await bucket.get("k") is None


async def test_keys_lists_present_keys_only(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    assert await bucket.keys() == []
    for key in ("b", "a", "wait.qwen3=3A8b.crew-a=2Fx", "c"):
        await bucket.put(key, b"v")
    await bucket.delete("c")
    assert await bucket.keys() == ["a", "b", "wait.qwen3=3A8b.crew-a=2Fx"]


async def test_buckets_are_separate(store: StoreUnderTest) -> None:
    one, two = await store.bucket("c"), await store.bucket("c")
    await one.put("k", b"1")
    assert await two.get("k") is None


async def test_watch_sees_only_changes_after_it_started(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    await bucket.put("old", b"before")
    watch = bucket.watch()
    await watch.ready()
    first = await bucket.put("new", b"after")
    await bucket.delete("old")
    changes = [await next_change(watch), await next_change(watch)]
    assert changes[0] == Change(bucket.name, "new", b"after", first)
    assert (changes[1].key, changes[1].value) == ("old", None)
    assert changes[1].revision > first
    await watch.aclose()


async def test_close_ends_watches_and_later_calls_fail(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c")
    watch = bucket.watch()
    await watch.ready()
    waiting = asyncio.ensure_future(watch.__anext__())
    await asyncio.sleep(0)  # one turn: the reader is waiting for the next change
    assert not waiting.done()
    await store.kv.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(StoreUnavailable):
        await bucket.get("k")


async def _until_absent(bucket: Bucket, key: str) -> None:
    """Until ``key`` reads as absent: woken by the store's changes (NATS leaves a marker
    when it expires a key), bounded only against a hung test."""
    async def gone() -> bool:
        return await bucket.get(key) is None

    await until_stored(bucket, gone, timeout=30, what=f"{key} expired")


async def test_per_key_ttl_expires_the_key(store: StoreUnderTest) -> None:
    # Expiry is awaited, not timed: a key whose TTL passed must go, one whose TTL has
    # far to run must stay, whatever the delays of a loaded machine in between.
    bucket = await store.bucket("c")
    await bucket.create("short", b"x", ttl=1)
    await bucket.create("lasting", b"z", ttl=600)
    await bucket.create("long", b"y")
    await store.age_on_server(1.5)
    await _until_absent(bucket, "short")
    assert await bucket.get("lasting") is not None  # its TTL has not passed
    assert sorted(await bucket.keys()) == ["lasting", "long"]
    await bucket.create("short", b"again")  # expired counts as absent


async def test_bucket_max_age_expires_old_writes(store: StoreUnderTest) -> None:
    bucket = await store.bucket("c", max_age=1.0)
    keeps = await store.bucket("d", max_age=600.0)
    await bucket.put("k", b"x")
    await keeps.put("k", b"x")
    await store.age_on_server(1.5)
    await _until_absent(bucket, "k")
    assert await keeps.get("k") is not None  # written at the same time, far from its age


@pytest.mark.parametrize(
    ("url", "kind"),
    [(None, MemoryKV), ("memory://", MemoryKV), ("nats", NatsKV)],
)
async def test_open_store_picks_the_engine(url: str | None, kind: type, nats_url: str) -> None:
    store: KV = await open_store(nats_url if url == "nats" else url)
    try:
        assert isinstance(store, kind)
        bucket: Bucket = await store.bucket("open_store_check", max_age=60)
        await bucket.put("k", b"v")
    finally:
        await store.close()


async def test_open_store_rejects_an_unknown_scheme() -> None:
    with pytest.raises(ValueError, match="unknown store URL"):
        await open_store("redis://localhost")


async def test_unreachable_nats_is_store_unavailable() -> None:
    from kubemoot.testing.nats_server import free_port

    settings = NatsSettings(
        servers=[f"nats://127.0.0.1:{free_port()}"], connect_timeout=0.5, max_reconnect_attempts=1
    )
    with pytest.raises(StoreUnavailable, match="cannot connect"):
        await NatsKV.connect(settings)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"servers": ["nats://127.0.0.1:4222"], "user": None, "token": None}),
        (
            {"KUBEMOOT_NATS_URL": "nats://a:4222, nats://b:4222", "KUBEMOOT_NATS_USER": "u",
             "KUBEMOOT_NATS_PASSWORD": "p"},
            {"servers": ["nats://a:4222", "nats://b:4222"], "user": "u", "password": "p"},
        ),
        (
            {"KUBEMOOT_NATS_TOKEN": "t", "KUBEMOOT_NATS_CREDS": "/x.creds",
             "KUBEMOOT_NATS_TLS_CA": "/ca.pem"},
            {"token": "t", "credentials_file": "/x.creds", "tls_ca": "/ca.pem"},
        ),
    ],
)
def test_nats_settings_from_env(env: dict[str, str], expected: dict[str, object]) -> None:
    settings = NatsSettings.from_env(env)
    for field, value in expected.items():
        assert getattr(settings, field) == value
