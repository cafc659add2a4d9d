"""Shared state: the KV protocol, the embedded store and the NATS JetStream store.

:func:`open_store` picks one from a URL, for CLIs and the demo. The NATS adapter is
imported only when a ``nats://`` URL asks for it, so importing this package never
pulls in ``nats``.
"""

from __future__ import annotations

from kubemoot.clock import Clock
from kubemoot.store.protocol import KV

__all__ = ["open_store"]


async def open_store(url: str | None = None, *, clock: Clock | None = None) -> KV:
    """``None`` or ``memory://`` → the embedded store; ``nats://…`` (or ``tls://…``,
    comma-separated for several servers) → NATS, with the other connection options
    (credentials, TLS) from ``KUBEMOOT_NATS_*``. Raises ``ValueError`` on other schemes
    and ``StoreUnavailable`` when NATS cannot be reached.
    """
    if url is None or url.strip() in ("", "memory://", "memory"):
        from kubemoot.store.memory import MemoryKV

        return MemoryKV(clock)
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not all(s.startswith(("nats://", "tls://")) for s in servers):
        raise ValueError(f"unknown store URL {url!r}: use memory:// or nats://HOST:PORT")
    import dataclasses

    from kubemoot.store.nats import NatsKV, NatsSettings

    settings = dataclasses.replace(NatsSettings.from_env(), servers=servers)
    return await NatsKV.connect(settings)
