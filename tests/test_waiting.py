"""kubemoot.testing.waiting: the few ways a test may wait, and how they fail."""

from __future__ import annotations

import asyncio

import pytest

from kubemoot.clock import ManualClock
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import NeverHappened, until_idle, until_stored, wait_until


async def test_wait_until_returns_the_first_truthy_value_of_a_plain_or_async_condition() -> None:
    looks: list[int] = []

    def third_look() -> str | None:
        looks.append(1)
        return "ready" if len(looks) == 3 else None

    assert await wait_until(third_look, timeout=30, what="x", interval=0) == "ready"
    assert len(looks) == 3

    async def at_once() -> int:
        return 7

    assert await wait_until(at_once, timeout=30, what="x") == 7


async def test_wait_until_names_what_never_happened_and_the_last_error() -> None:
    def missing() -> object:
        raise KeyError("gpu-a")

    with pytest.raises(NeverHappened, match=r"the card appearing: did not happen within 0 s "
                                            r"\(last error: KeyError\('gpu-a'\)\)"):
        await wait_until(missing, timeout=0, what="the card appearing", ignoring=(KeyError,))
    with pytest.raises(KeyError):  # an error not named in ``ignoring`` is a failure at once
        await wait_until(missing, timeout=30, what="the card appearing")


async def test_until_stored_looks_again_at_each_change_of_the_bucket() -> None:
    kv = MemoryKV(ManualClock(1_700_000_000.0))
    bucket = await kv.bucket("b")

    async def written() -> bytes | None:
        entry = await bucket.get("k")
        return entry.value if entry is not None else None

    waiting = asyncio.create_task(until_stored(bucket, written, timeout=30, what="k"))
    await until_idle()
    assert not waiting.done()  # nothing written yet, and nothing polls
    await bucket.put("other", b"-")
    await until_idle()
    assert not waiting.done()
    await bucket.put("k", b"v")
    assert await waiting == b"v"
    await kv.close()


async def test_until_stored_fails_naming_the_bucket() -> None:
    kv = MemoryKV(ManualClock(1_700_000_000.0))
    bucket = await kv.bucket("tickets")
    with pytest.raises(NeverHappened, match=r"a ticket: did not happen .* changes to tickets"):
        await until_stored(bucket, lambda: False, timeout=0, what="a ticket")
    await kv.close()


async def test_until_idle_waits_however_many_turns_the_work_takes() -> None:
    hops: list[int] = []

    async def relay(left: int) -> None:
        hops.append(left)
        if left:
            await asyncio.create_task(relay(left - 1))  # one more task, more loop turns

    task = asyncio.create_task(relay(200))
    await until_idle()
    assert task.done() and len(hops) == 201


async def test_until_idle_fails_on_a_loop_that_never_rests() -> None:
    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    spinner = asyncio.create_task(spin())
    try:
        with pytest.raises(NeverHappened, match="still had work ready after 50 turns"):
            await until_idle(turns=50)
    finally:
        spinner.cancel()
