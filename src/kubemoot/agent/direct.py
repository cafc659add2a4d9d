"""The direct-probe fallback: provider state when the shared state has none.

The operator's prober publishes every ModelProvider's state; an agent that starts
before its first probe (or after NATS lost its buckets) finds the state bucket empty,
and a runtime with no state cannot place anything. The spec's fallback is to probe the
providers directly: the agent knows the endpoints its binding names
(``KUBEMOOT_MODEL_ENDPOINT``, ``KUBEMOOT_TRIAGE_MODEL_ENDPOINT``), so while the bucket
holds no operator state it probes those and publishes what it sees under names of its
own, ``direct:<host:port>``. The runtime then places against them like any provider:
a copy already resident is used warm; a provider whose VRAM total nobody declared
never proves a model too large, so a call that would need a load waits, and the
capacity watch wakes it when the operator's state arrives.

Once any operator state is there, the direct documents are withdrawn (their providers
would otherwise count the same card twice), and their endpoints are known again by
their ModelProvider names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit

from kubemoot import metrics
from kubemoot.providers.prober import Prober
from kubemoot.providers.protocol import ProviderClient
from kubemoot.store.documents import ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, StoreError

__all__ = ["DIRECT_PREFIX", "DirectProbe", "direct_name", "is_direct"]

log = logging.getLogger(__name__)

DIRECT_PREFIX = "direct:"

MakeClient = Callable[[ProviderState], ProviderClient]


def direct_name(endpoint: str) -> str:
    """The provider name an agent publishes a directly probed endpoint under."""
    parts = urlsplit(endpoint.strip())
    return DIRECT_PREFIX + (parts.netloc or endpoint.strip().rstrip("/"))


def is_direct(provider: str) -> bool:
    return provider.startswith(DIRECT_PREFIX)


class DirectProbe:
    """Probes the bound endpoints while the shared state has no operator state."""

    def __init__(self, endpoints: Iterable[str], *, states: Bucket, prober: Prober,
                 make_client: MakeClient) -> None:
        self.endpoints = tuple(dict.fromkeys(e.strip().rstrip("/") for e in endpoints
                                             if e.strip()))
        self._states = states
        self._prober = prober
        self._make = make_client
        self._clients: dict[str, ProviderClient] = {}

    @property
    def active(self) -> bool:
        """Whether the last step probed (the shared state had no operator state)."""
        return bool(self._clients)

    async def step(self, seen: Mapping[str, ProviderState]) -> bool:
        """One round after a read of the bucket; returns whether it wrote anything.

        ``seen`` is every provider state the bucket holds, by provider name.
        """
        operator = [s for name, s in seen.items() if not is_direct(name)]
        if operator:
            return await self._withdraw(seen)
        wrote = False
        for endpoint in self.endpoints:
            name = direct_name(endpoint)
            client = self._clients.get(name)
            if client is None:
                if not self._clients:
                    log.warning("no provider state in the shared store: probing %s "
                                "directly until the operator publishes",
                                ", ".join(self.endpoints))
                client = self._clients[name] = self._make(
                    ProviderState(provider=name, endpoint=endpoint, ready=False))
            await self._prober.probe_one(client)  # publishes; never raises
            wrote = True
        return wrote

    async def _withdraw(self, seen: Mapping[str, ProviderState]) -> bool:
        """Delete the direct documents: the operator's state now covers the cards."""
        direct = [name for name in seen if is_direct(name)]
        for name in direct:
            try:
                await self._states.delete(encode_token(name))
            except StoreError as error:
                metrics.survived("agent", "direct-withdraw", metrics.STORE,
                                 f"withdrawing the direct state of {name} failed", error,
                                 logger=log)
        if self._clients:
            log.warning("the operator publishes provider state again: direct probing "
                        "of %s stopped", ", ".join(self.endpoints))
        for client in self._clients.values():
            close = getattr(client, "close", None)
            if close is not None:
                try:
                    await close()
                except Exception as error:  # closing must not stop the agent
                    log.warning("closing %s failed: %s", client.name, error)
        self._clients.clear()
        return bool(direct)
