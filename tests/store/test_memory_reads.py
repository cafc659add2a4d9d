"""The embedded store's ``get_many``: a gather of gets without a task per key.

It must answer what the gather answers and in the same loop turns, so that a reader
switched to it (the demand board) interleaves with other tasks exactly as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kubemoot.clock import ManualClock
from kubemoot.store.memory import MemoryBucket, MemoryKV
from kubemoot.store.protocol import Entry, StoreUnavailable

Reader = Callable[[MemoryBucket, list[str]], Awaitable[list[Entry | None]]]


async def _gathered(bucket: MemoryBucket, keys: list[str]) -> list[Entry | None]:
    return list(await asyncio.gather(*(bucket.get(k) for k in keys)))


async def _many(bucket: MemoryBucket, keys: list[str]) -> list[Entry | None]:
    return await bucket.get_many(keys)


async def _filled() -> tuple[MemoryKV, MemoryBucket, ManualClock]:
    clock = ManualClock(1000.0)
    kv = MemoryKV(clock=clock)
    bucket = await kv.bucket("demand")
    await bucket.put("a", b"1")
    await bucket.create("short", b"2", ttl=5.0)
    await bucket.put("b", b"3")
    return kv, bucket, clock


async def test_get_many_answers_what_a_get_per_key_answers() -> None:
    kv, bucket, clock = await _filled()
    clock.advance(10.0)  # "short" has expired: it reads as absent
    keys = ["a", "short", "missing", "b"]
    assert await bucket.get_many(keys) == [await bucket.get(k) for k in keys]
    assert await bucket.get_many([]) == []
    await kv.close()
    with pytest.raises(StoreUnavailable):
        await bucket.get_many(["a"])


async def _interleaved(read: Reader) -> tuple[list[str], list[Entry | None]]:
    """Another task writes and notes every turn while ``read`` runs; what it read and
    where in that task's turns it went on."""
    kv, bucket, _clock = await _filled()
    log: list[str] = []

    async def writer() -> None:
        for turn in range(5):
            await bucket.put("a", f"w{turn}".encode())
            log.append(f"write {turn}")
            await asyncio.sleep(0)

    async def reader() -> list[Entry | None]:
        await asyncio.sleep(0)  # start a turn after the writer
        found = await read(bucket, ["a", "b"])
        log.append("read back")
        return found

    found, _ = await asyncio.gather(reader(), writer())
    await kv.close()
    return log, found


@pytest.mark.parametrize("read", [_gathered, _many])
async def test_get_many_reads_and_returns_in_the_turns_of_a_gather(read: Reader) -> None:
    log, found = await _interleaved(read)
    assert log.index("read back") == 4  # the reader went on after the writer's 4th turn
    values = [None if e is None else e.value for e in found]
    assert values == [b"w1", b"3"]  # read in the turn after it asked, before "w2"


async def test_get_many_and_a_gather_interleave_the_same() -> None:
    assert await _interleaved(_many) == await _interleaved(_gathered)


async def test_the_kept_listing_is_what_a_sweep_of_the_items_finds() -> None:
    # The bucket keeps its keys in order as it writes; a listing must still be the
    # present keys, sorted, after overwrites, deletes, TTLs, a max age and a re-create.
    clock = ManualClock(1000.0)
    bucket = await MemoryKV(clock=clock).bucket("demand", max_age=50.0)

    async def present() -> list[str]:
        found = [k for k in ("a", "b", "c", "d", "e") if await bucket.get(k) is not None]
        return sorted(found)

    await bucket.put("c", b"1")
    await bucket.create("a", b"1", ttl=5.0)
    await bucket.put("e", b"1")
    await bucket.put("b", b"1")
    assert await bucket.keys() == ["a", "b", "c", "e"]
    await bucket.put("c", b"2")  # an overwrite is not a second key
    await bucket.delete("e")
    await bucket.delete("never-there")
    assert await bucket.keys() == ["a", "b", "c"] == await present()
    clock.advance(6.0)  # "a" lapses on its TTL
    assert await bucket.keys() == ["b", "c"]
    await bucket.create("a", b"again", ttl=100.0)
    clock.advance(30.0)
    await bucket.put("b", b"kept alive")  # its max age counts from this write
    clock.advance(30.0)  # "c" (written 66 s ago) lapses; "a" and "b" stay
    assert await bucket.keys() == ["a", "b"] == await present()
    clock.advance(100.0)
    assert await bucket.keys() == []
    await bucket.put("d", b"1")
    assert await bucket.keys() == ["d"] == await present()
