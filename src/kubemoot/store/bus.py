"""The message bus a crew's processes talk over, as a protocol.

A crew whose agents run as separate processes (one Deployment per Agent) discusses
over subjects of a message bus: the coordinator asks members to take part, members
report signals and call records back. This module names only what the crew needs of a
bus: publish, subscribe (optionally in a queue group, so one of several replicas takes
a request), request-reply, and a roll call that gathers every reply within a window.

:class:`MemoryBus` is the in-process bus (tests, a crew in one process);
:mod:`kubemoot.store.natsbus` is the NATS adapter. Like the KV protocol beside it, the
agent package sees only this protocol: whoever wires a process picks the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "Bus",
    "BusError",
    "Handler",
    "MemoryBus",
    "Message",
    "NoResponders",
    "Subscription",
]


class BusError(Exception):
    """The bus could not deliver (connection lost, request timed out)."""


class NoResponders(BusError):
    """Nobody listens on the subject a request went to."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message as a handler receives it; ``reply`` is where an answer goes."""

    subject: str
    data: bytes
    reply: str = ""


Handler = Callable[[Message], Awaitable[None]]


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...

    async def drain(self) -> None:
        """Unsubscribe, but first hand the handler every message already on its way
        (sent to this subscription before the bus learned it ends)."""
        ...


class Bus(Protocol):
    """What a crew needs of a message bus."""

    async def publish(self, subject: str, data: bytes) -> None: ...

    async def subscribe(self, subject: str, handler: Handler, *,
                        queue: str = "") -> Subscription: ...

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        """One reply; :class:`NoResponders` when nobody listens, :class:`BusError`
        when no reply came within ``timeout`` seconds."""
        ...

    async def gather(self, subject: str, data: bytes, *, window: float) -> list[bytes]:
        """Every reply that arrives within ``window`` seconds (a roll call)."""
        ...


# -- the in-process bus ----------------------------------------------------------------


@dataclass(eq=False)
class _Sub:
    bus: MemoryBus
    subject: str
    handler: Handler
    queue: str

    async def unsubscribe(self) -> None:
        with contextlib.suppress(ValueError):
            self.bus._subs.remove(self)

    async def drain(self) -> None:
        # Delivery here is a task per message started at publish: none is on its way.
        await self.unsubscribe()


@dataclass(eq=False)
class MemoryBus:
    """Subjects within one event loop; same delivery rules as NATS for what we use:
    exact subjects, every plain subscriber gets a copy, one per queue group."""

    _subs: list[_Sub] = field(default_factory=list)
    _inboxes: itertools.count[int] = field(default_factory=itertools.count)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    async def publish(self, subject: str, data: bytes) -> None:
        self._deliver(Message(subject, data))

    def _deliver(self, message: Message) -> int:
        chosen: list[_Sub] = []
        groups: dict[str, list[_Sub]] = {}
        for sub in self._subs:
            if sub.subject != message.subject:
                continue
            if sub.queue:
                groups.setdefault(sub.queue, []).append(sub)
            else:
                chosen.append(sub)
        for members in groups.values():
            chosen.append(members[next(self._turn) % len(members)])
        for sub in chosen:
            task = asyncio.ensure_future(sub.handler(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return len(chosen)

    async def subscribe(self, subject: str, handler: Handler, *,
                        queue: str = "") -> Subscription:
        sub = _Sub(self, subject, handler, queue)
        self._subs.append(sub)
        return sub

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        inbox = f"_INBOX.{next(self._inboxes)}"
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def take(message: Message) -> None:
            if not answer.done():
                answer.set_result(message.data)

        sub = await self.subscribe(inbox, take)
        try:
            if self._deliver(Message(subject, data, inbox)) == 0:
                raise NoResponders(f"nobody listens on {subject}")
            try:
                return await asyncio.wait_for(answer, timeout)
            except TimeoutError:
                raise BusError(f"no reply on {subject} within {timeout:g} s") from None
        finally:
            await sub.unsubscribe()

    async def gather(self, subject: str, data: bytes, *, window: float) -> list[bytes]:
        inbox = f"_INBOX.{next(self._inboxes)}"
        replies: list[bytes] = []

        async def take(message: Message) -> None:
            replies.append(message.data)

        sub = await self.subscribe(inbox, take)
        try:
            if self._deliver(Message(subject, data, inbox)):
                await asyncio.sleep(window)  # a roll call lasts its window by definition
        finally:
            await sub.unsubscribe()
        return list(replies)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
