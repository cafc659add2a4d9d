"""The crew's bus: the in-process bus behaves as the NATS adapter does for what a crew
uses (fan-out, queue groups, request-reply, no responders, roll calls)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kubemoot.settings import NatsSettings
from kubemoot.store.bus import Bus, BusError, MemoryBus, Message, NoResponders
from kubemoot.store.nats import NatsKV
from kubemoot.store.natsbus import NatsBus
from kubemoot.testing.nats_server import running_nats_server


@pytest.fixture(params=["memory", pytest.param("nats", marks=pytest.mark.nats)])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    if request.param == "memory":
        memory = MemoryBus()
        yield memory
        await memory.close()
        return
    async with running_nats_server() as server:
        kv = await NatsKV.connect(NatsSettings(servers=[server.url]))
        try:
            yield NatsBus(kv)
        finally:
            await kv.close()


async def test_every_plain_subscriber_gets_a_copy_and_a_queue_group_one(bus: Bus) -> None:
    got: list[str] = []
    both = asyncio.Event()

    def taker(name: str) -> Callable[[Message], Awaitable[None]]:
        async def take(message: Message) -> None:
            got.append(name)
            if len(got) == 3:
                both.set()
        return take

    await bus.subscribe("crew.x", taker("plain-1"))
    await bus.subscribe("crew.x", taker("plain-2"))
    await bus.subscribe("crew.x", taker("replica-1"), queue="replicas")
    await bus.subscribe("crew.x", taker("replica-2"), queue="replicas")
    await bus.publish("crew.x", b"hello")
    await asyncio.wait_for(both.wait(), 5.0)
    assert sorted(got)[:2] == ["plain-1", "plain-2"]
    assert len([g for g in got if g.startswith("replica")]) == 1


async def test_request_reply_and_no_responders(bus: Bus) -> None:
    async def echo(message: Message) -> None:
        await bus.publish(message.reply, message.data.upper())

    await bus.subscribe("crew.echo", echo)
    assert await bus.request("crew.echo", b"ping", timeout=5.0) == b"PING"
    with pytest.raises(NoResponders):
        await bus.request("crew.nobody", b"ping", timeout=5.0)

    async def mute(message: Message) -> None:
        return None

    await bus.subscribe("crew.mute", mute)
    with pytest.raises(BusError, match="no reply"):
        await bus.request("crew.mute", b"ping", timeout=0.2)


async def test_a_roll_call_gathers_every_answer(bus: Bus) -> None:
    for name in (b"a", b"b", b"c"):
        async def answer(message: Message, name: bytes = name) -> None:
            await bus.publish(message.reply, name)

        await bus.subscribe("crew.rollcall", answer)
    assert sorted(await bus.gather("crew.rollcall", b"{}", window=0.5)) == [b"a", b"b", b"c"]
    assert await bus.gather("crew.empty", b"{}", window=0.05) == []
