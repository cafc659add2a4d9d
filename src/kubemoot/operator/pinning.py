"""``Model.spec.pinned`` in a cluster: the operator publishes each provider's pinned
models with its probe, and loads back a pinned model its provider lost.

The runtime's eviction leaves a copy alone only when the provider's published state
lists it in ``pinned``; in a cluster the operator's prober is the one that publishes
that state, so the pins travel with every probe (and a Model that starts or stops
pinning republishes its provider at once). Loads go through the per-call runtime
(:func:`kubemoot.runtime.pinning.load_pinned`), as the gateway's do: a ticket on the
card's memory, confined to that provider, refused at once when the card is busy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import KVStatePublisher
from kubemoot.runtime.builder import Runtime
from kubemoot.runtime.pinning import load_pinned, missing_pinned
from kubemoot.store.documents import ProviderState
from kubemoot.store.protocol import Bucket

__all__ = ["PinningPublisher", "load_missing_pinned"]

log = logging.getLogger(__name__)


class PinningPublisher(KVStatePublisher):
    """Publishes a probe's state with the models the cluster's Models pin there."""

    def __init__(self, bucket: Bucket, pins: Callable[[], Mapping[str, Sequence[str]]]) -> None:
        super().__init__(bucket)
        self._pins = pins

    async def __call__(self, state: ProviderState) -> None:
        state.pinned = list(self._pins().get(state.provider, ()))
        await super().__call__(state)


async def load_missing_pinned(
    runtime: Runtime, clients: Mapping[str, OllamaProvider],
    states: Mapping[str, ProviderState], pins: Mapping[str, Sequence[str]],
) -> list[str]:
    """Load every pinned model its ready provider does not hold; ``provider/model`` of
    each load that went through (the caller re-probes those providers)."""
    done = []
    for provider, model in missing_pinned(states, pins):
        client = clients.get(provider)
        if client is None:
            continue

        async def load(client: OllamaProvider = client, model: str = model) -> None:
            # keep_alive -1: the engine holds the copy until told otherwise
            await client.preload(model, keep_alive=-1)

        if await load_pinned(runtime.calls, provider=provider, model=model,
                             providers=list(clients), load=load):
            done.append(f"{provider}/{model}")
    return done
