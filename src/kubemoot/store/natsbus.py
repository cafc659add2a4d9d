"""The crew's message bus (:class:`kubemoot.store.bus.Bus`) over a NATS connection.

An agent process already holds one NATS connection for the shared state
(:class:`~kubemoot.store.nats.NatsKV`); the bus rides on the same connection, so a
process has one login, one reconnect policy and one place where it can be lost.
Every NATS exception is mapped here to :class:`~kubemoot.store.bus.BusError`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import nats.errors

from kubemoot.store.bus import BusError, Handler, Message, NoResponders, Subscription
from kubemoot.store.nats import NatsKV

__all__ = ["NatsBus"]

log = logging.getLogger(__name__)

NO_RESPONDERS_STATUS = "503"


class _NatsSubscription:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def unsubscribe(self) -> None:
        try:
            await self._inner.unsubscribe()
        except nats.errors.Error as error:  # a closed connection has no subscriptions
            log.debug("unsubscribe failed: %s", error)

    async def drain(self) -> None:
        try:
            await self._inner.drain()
        except nats.errors.Error as error:
            log.debug("draining a subscription failed: %s", error)


class NatsBus:
    """Publish, subscribe and request on the connection of a :class:`NatsKV`."""

    def __init__(self, kv: NatsKV) -> None:
        self._nc = kv.connection

    async def publish(self, subject: str, data: bytes) -> None:
        try:
            await self._nc.publish(subject, data)
        except (nats.errors.Error, OSError) as error:
            raise BusError(f"cannot publish on {subject}: {error}") from error

    async def subscribe(self, subject: str, handler: Handler, *,
                        queue: str = "") -> Subscription:
        async def deliver(msg: Any) -> None:
            try:
                await handler(Message(msg.subject, msg.data, msg.reply or ""))
            except Exception:  # a handler's bug must not stop the subscription
                log.exception("handler for %s failed", subject)

        try:
            inner = await self._nc.subscribe(subject, queue=queue, cb=deliver)
        except (nats.errors.Error, OSError) as error:
            raise BusError(f"cannot subscribe to {subject}: {error}") from error
        return _NatsSubscription(inner)

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        try:
            reply = await self._nc.request(subject, data, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise NoResponders(f"nobody listens on {subject}") from None
        except (nats.errors.TimeoutError, TimeoutError):
            raise BusError(f"no reply on {subject} within {timeout:g} s") from None
        except (nats.errors.Error, OSError) as error:
            raise BusError(f"request on {subject} failed: {error}") from error
        return bytes(reply.data)

    async def gather(self, subject: str, data: bytes, *, window: float) -> list[bytes]:
        replies: list[bytes] = []

        async def take(msg: Any) -> None:
            # With nobody listening the server answers the inbox itself ("503 no
            # responders", headers only): that is not a reply.
            if (msg.headers or {}).get("Status") == NO_RESPONDERS_STATUS:
                return
            replies.append(bytes(msg.data))

        try:
            inbox = self._nc.new_inbox()
            sub = await self._nc.subscribe(inbox, cb=take)
            try:
                await self._nc.publish(subject, data, reply=inbox)
                await asyncio.sleep(window)  # a roll call lasts its window by definition
            finally:
                await sub.unsubscribe()
        except (nats.errors.Error, OSError) as error:
            raise BusError(f"roll call on {subject} failed: {error}") from error
        return replies
