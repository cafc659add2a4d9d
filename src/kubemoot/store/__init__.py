"""Shared state: the KV protocol, the embedded store and the NATS JetStream store.

:func:`open_store` picks one from a URL, for CLIs and the demo. The NATS adapter is
imported only when a ``nats://`` URL or NATS settings ask for it, so importing this
package never pulls in ``nats``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubemoot.clock import Clock
from kubemoot.store.protocol import KV

if TYPE_CHECKING:
    from kubemoot.settings import NatsSettings

__all__ = ["open_store"]

_MEMORY_URLS = ("", "memory://", "memory")


async def open_store(
    url: str | None = None, *, clock: Clock | None = None, nats: NatsSettings | None = None
) -> KV:
    """Open the embedded store or a NATS JetStream store.

    * ``url`` ``None`` (and no ``nats``) or ``memory://`` → the embedded store;
    * ``nats://…`` or ``tls://…`` (comma-separated for several servers) → NATS at those
      servers, with the other connection options (credentials, TLS, reconnects) from
      ``nats`` when given, else the defaults (the entry point that read
      ``KUBEMOOT_NATS_*`` passes ``nats``);
    * ``url`` ``None`` with ``nats`` → NATS exactly as ``nats`` says, servers included.

    Raises ``ValueError`` on other schemes or on ``memory://`` together with NATS
    settings, and ``StoreUnavailable`` when NATS cannot be reached.
    """
    if url is None and nats is not None:
        from kubemoot.store.nats import NatsKV

        return await NatsKV.connect(nats)
    if url is None or url.strip() in _MEMORY_URLS:
        if nats is not None:
            raise ValueError("NATS settings given for the embedded store (memory://)")
        from kubemoot.store.memory import MemoryKV

        return MemoryKV(clock)
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not all(s.startswith(("nats://", "tls://")) for s in servers):
        raise ValueError(f"unknown store URL {url!r}: use memory:// or nats://HOST:PORT")
    import dataclasses

    from kubemoot.settings import NatsSettings
    from kubemoot.store.nats import NatsKV

    base = nats if nats is not None else NatsSettings()
    return await NatsKV.connect(dataclasses.replace(base, servers=servers))
