"""The prober: provider answers → provider-state documents in the shared store.

For every provider it asks :meth:`ProviderClient.probe`, keeps the first footprint
observed for each model (DESIGN §6 ``loadedModelFootprints``: the KV-inclusive number
the selector uses as occupancy, kept after the model unloads and across prober
restarts), and publishes the document. A provider that cannot be probed is published
*not ready* with a reason; the prober itself never raises to its caller, so one broken
endpoint never stops the others from being observed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from kubemoot import metrics
from kubemoot.clock import Clock
from kubemoot.providers.protocol import ProviderClient, ProviderError, ProviderState
from kubemoot.settings import DEFAULT_RESERVE_MIB
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, StoreError

__all__ = ["KVStatePublisher", "Prober", "publish_to_kv"]

log = logging.getLogger(__name__)

Publish = Callable[[ProviderState], Awaitable[None]]
LoadPrevious = Callable[[str], Awaitable[ProviderState | None]]


class KVStatePublisher:
    """Writes provider-state documents to ``kubemoot_provider_state/<provider>``.

    The prober is the single writer of each provider's key, so a plain ``put`` is
    enough. :meth:`previous` reads the stored document back, which is how first-observed
    footprints survive a prober restart.
    """

    def __init__(self, bucket: Bucket) -> None:
        if bucket.name != PROVIDER_STATE_BUCKET:
            log.warning("provider state published to bucket %r, not %r",
                        bucket.name, PROVIDER_STATE_BUCKET)
        self.bucket = bucket

    async def __call__(self, state: ProviderState) -> None:
        await self.bucket.put(encode_token(state.provider), state.to_json())

    async def previous(self, provider: str) -> ProviderState | None:
        entry = await self.bucket.get(encode_token(provider))
        if entry is None:
            return None
        try:
            return ProviderState.from_json(entry.value)
        except ValueError as error:
            # the footprints it held are lost; say so rather than forget them quietly
            metrics.survived("prober", "read-state", metrics.UNREADABLE,
                             f"stored state of {provider} is unreadable; starting afresh",
                             error, logger=log)
            return None


def publish_to_kv(bucket: Bucket) -> KVStatePublisher:
    """A ``publish`` callback for :class:`Prober` that writes to ``bucket``."""
    return KVStatePublisher(bucket)


def _spec_int(client: ProviderClient, attribute: str) -> int | None:
    # ProviderClient guarantees only name and endpoint; adapters such as OllamaProvider
    # also expose the ModelProvider spec values, which a not-ready document still carries.
    value = getattr(client, attribute, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Prober:
    """Probes providers and publishes what it saw; never raises to its caller."""

    def __init__(
        self,
        clients: Sequence[ProviderClient],
        *,
        clock: Clock,
        publish: Publish | None = None,
        previous: LoadPrevious | None = None,
        interval_seconds: float | None = None,
    ) -> None:
        self.clients = list(clients)
        #: How often this prober probes; published with each state, so that readers can
        #: tell a state nobody refreshes any more from a current one (None: no promise).
        self.interval_seconds = interval_seconds
        self._clock = clock
        self._publish = publish
        if previous is None and isinstance(publish, KVStatePublisher):
            previous = publish.previous
        self._previous = previous
        self._footprints: dict[str, dict[str, int]] = {}
        self._intervals: dict[str, float | None] = {}  # the stored states' promises
        self.last_states: dict[str, ProviderState] = {}

    async def probe_all(self) -> list[ProviderState]:
        """Probe every provider at once; one state per client, in the clients' order."""
        return list(await asyncio.gather(*(self.probe_one(c) for c in self.clients)))

    async def probe_one(self, client: ProviderClient) -> ProviderState:
        """Probe one provider, merge first-observed footprints, publish; never raises.

        ``lastProbedAt`` is the prober's clock when the probe began: the publisher's
        time is the one readers judge freshness by, and the start is the conservative end.
        """
        started = self._clock.now()
        try:
            state = await client.probe()
        except ProviderError as error:
            state = self._not_ready(client, error.message)
        except Exception as error:  # a bug in an adapter must not stop the prober
            log.exception("probe of %s failed unexpectedly", client.name)
            state = self._not_ready(client, f"probe failed: {type(error).__name__}: {error}")
        state.provider = client.name
        state.last_probed_at = started
        if not state.ready:
            metrics.PROBE_ERRORS.labels(provider=client.name).inc()
        state.loaded_model_footprints = await self._first_observed(client.name, state)
        # A prober that probes only now and then (an agent's after a load) keeps the
        # promise of the one that probes the provider periodically.
        state.probe_interval_seconds = (self.interval_seconds
                                        if self.interval_seconds is not None
                                        else self._intervals.get(client.name))
        self.last_states[client.name] = state
        if self._publish is not None:
            try:
                await self._publish(state)
            except (StoreError, OSError) as error:
                metrics.survived("prober", "publish", metrics.STORE,
                                 f"publishing the state of {client.name} failed", error,
                                 logger=log)
        return state

    def _not_ready(self, client: ProviderClient, reason: str) -> ProviderState:
        reserve = _spec_int(client, "reserve_mib")
        parallel = _spec_int(client, "num_parallel")
        return ProviderState(
            provider=client.name,
            endpoint=client.endpoint,
            ready=False,
            reason=reason,
            last_probed_at=self._clock.now(),
            total_vram_mib=_spec_int(client, "total_vram_mib"),
            reserve_mib=DEFAULT_RESERVE_MIB if reserve is None else reserve,
            max_parallel=1 if parallel is None else parallel,
            context_length=_spec_int(client, "context_length"),
        )

    async def _first_observed(self, provider: str, state: ProviderState) -> dict[str, int]:
        """Earlier observations win: stored document, then memory, then this probe."""
        known = self._footprints.setdefault(provider, {})
        if self._previous is not None:
            try:
                stored = await self._previous(provider)
            except (StoreError, OSError) as error:
                metrics.survived("prober", "read-state", metrics.STORE,
                                 f"reading the stored state of {provider} failed", error,
                                 logger=log)
                stored = None
            if stored is not None:
                self._intervals[provider] = stored.probe_interval_seconds
                for model, mib in stored.loaded_model_footprints.items():
                    known[model] = mib  # the stored value is the oldest observation
        for model, mib in state.loaded_model_footprints.items():
            known.setdefault(model, mib)
        return dict(known)

    async def run(
        self, interval: float, *, rounds: int | None = None, probe_first: bool = True
    ) -> None:
        """Probe every ``interval`` seconds of the clock; forever unless ``rounds``.

        ``probe_first=False`` waits one interval first: for a caller that has just
        probed every provider itself, so nothing it saw is overwritten at once.
        """
        self.interval_seconds = interval
        if not probe_first:
            await self._clock.sleep(interval)
        done = 0
        while rounds is None or done < rounds:
            await self.probe_all()
            done += 1
            if rounds is None or done < rounds:
                await self._clock.sleep(interval)
