"""The provider view: fresh shared state, read cheaply.

Every call reads the provider-state and ticket documents of every provider. A short
cache (``state_cache_seconds``, 200 ms by default) absorbs bursts when one agent fans
out many calls at once. This process's own claims and releases are applied to the
cached documents at once (a refused claim or an eviction drops the provider's entry
for a re-read), so its own decisions always see its own tickets. Parsed documents
are reused while their revision has not moved.

With no provider state published at all, the view asks a :class:`Prober` to look at
the providers directly; without a prober it reports the static endpoint, if any.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from kubemoot.clock import Clock
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.settings import RuntimeSettings
from kubemoot.runtime.snapshot import FleetSnapshot, ProviderSnapshot
from kubemoot.store.documents import ProviderState, ProviderTickets, Ticket
from kubemoot.store.keys import decode_token, encode_token
from kubemoot.store.protocol import Bucket


class Prober(Protocol):
    """Looks at every known provider directly (used when no state is published)."""

    async def probe_all(self) -> list[ProviderState]: ...


@dataclass(slots=True)
class _Parsed:
    revision: int
    state: ProviderState | None = None
    tickets: ProviderTickets | None = None


class ProviderView:
    """Builds :class:`FleetSnapshot` values from the shared state."""

    def __init__(
        self,
        states: Bucket,
        tickets: Bucket,
        *,
        clock: Clock,
        settings: RuntimeSettings | None = None,
        latency: LatencyTracker | None = None,
        circuits: CircuitBreakers | None = None,
        prober: Prober | None = None,
        static_endpoint: str | None = None,
    ) -> None:
        self._states = states
        self._tickets = tickets
        self._clock = clock
        self._settings = settings or RuntimeSettings()
        self._latency = latency or LatencyTracker(
            alpha=self._settings.latency_ema_alpha,
            default_seconds=self._settings.default_latency_seconds,
        )
        self._circuits = circuits
        self._prober = prober
        self.static_endpoint = static_endpoint
        self._fleet: FleetSnapshot | None = None
        self._read_at = float("-inf")
        self._stale: set[str] = set()
        self._keys: list[str] | None = None
        self._listed_at = float("-inf")
        self._parsed_states: dict[str, _Parsed] = {}
        self._parsed_tickets: dict[str, _Parsed] = {}
        self._docs: dict[str, tuple[ProviderState, ProviderTickets | None]] = {}
        self._built: dict[
            str,
            tuple[ProviderState, ProviderTickets | None, tuple[float, bool], float,
                  ProviderSnapshot],
        ] = {}

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def latency(self) -> LatencyTracker:
        return self._latency

    @property
    def circuits(self) -> CircuitBreakers | None:
        return self._circuits

    def invalidate(self, provider: str | None = None) -> None:
        """Forget cached state: of one provider (after an own claim or unload), or of all."""
        if provider is None:
            self._read_at = float("-inf")
            self._keys = None
        else:
            self._stale.add(provider)

    def note_claimed(self, provider: str, ticket: Ticket) -> None:
        """This process's claim succeeded: show its ticket without a re-read."""
        current = self._docs.get(provider)
        if current is None or provider in self._stale:
            self.invalidate(provider)
            return
        state, doc = current
        kept = [] if doc is None else [t for t in doc.tickets if t.ticket_id != ticket.ticket_id]
        self._docs[provider] = (
            state, ProviderTickets(provider=provider, tickets=[*kept, ticket])
        )

    def note_released(self, provider: str, ticket_id: str) -> None:
        """This process released a ticket: drop it without a re-read."""
        current = self._docs.get(provider)
        if current is None:
            return
        state, doc = current
        if doc is None:
            return
        kept = [t for t in doc.tickets if t.ticket_id != ticket_id]
        self._docs[provider] = (state, ProviderTickets(provider=provider, tickets=kept))

    async def snapshot(self) -> FleetSnapshot:
        """The fleet now; cached documents are reused within the cache window."""
        now = self._clock.now()
        if now - self._read_at >= self._settings.state_cache_seconds:
            await self._read_all()
            self._read_at = now
            self._stale.clear()
        elif self._stale:
            for provider in sorted(self._stale):
                await self._read_provider(provider)
            self._stale.clear()
        if not self._docs and self._prober is not None:
            probed = await self._prober.probe_all()
            return FleetSnapshot.of(now, [self._provider(s, None, now) for s in probed])
        return FleetSnapshot.of(
            now, [self._provider(s, t, now) for s, t in self._docs.values()]
        )

    def _provider(
        self, state: ProviderState, tickets: ProviderTickets | None, now: float
    ) -> ProviderSnapshot:
        circuit_open = self._circuits is not None and not self._circuits.allows(state.provider)
        latency = self._latency.latency(state.endpoint)
        cached = self._built.get(state.provider)
        if (
            cached is not None
            and cached[0] is state
            and cached[1] is tickets
            and cached[2] == (latency, circuit_open)
            and now < cached[3]
        ):
            return cached[4]  # same documents, no ticket lapsed since: same snapshot
        active = tuple(tickets.active(now)) if tickets is not None else ()
        built = ProviderSnapshot(
            state=state, tickets=active, latency_seconds=latency, circuit_open=circuit_open
        )
        valid_until = min((t.expires_at for t in active), default=float("inf"))
        self._built[state.provider] = (
            state, tickets, (latency, circuit_open), valid_until, built
        )
        return built

    async def _read_all(self) -> None:
        # Reads go out together: on a networked store one refresh costs about one round
        # trip per bucket, not one per provider.
        now = self._clock.now()
        if self._keys is None or now - self._listed_at >= self._settings.discovery_seconds:
            self._keys = sorted(await self._states.keys())
            self._listed_at = now
        keys = self._keys
        states = await asyncio.gather(*(self._state(k) for k in keys))
        present = [s for s in states if s is not None]
        tickets = await asyncio.gather(
            *(self._tickets_doc(encode_token(s.provider)) for s in present)
        )
        self._docs = {s.provider: (s, t) for s, t in zip(present, tickets, strict=True)}

    async def _read_provider(self, provider: str) -> None:
        key = encode_token(provider)
        state, tickets = await asyncio.gather(self._state(key), self._tickets_doc(key))
        if state is None:
            self._docs.pop(provider, None)
        else:
            self._docs[provider] = (state, tickets)

    async def _state(self, key: str) -> ProviderState | None:
        entry = await self._states.get(key)
        if entry is None:
            return None
        cached = self._parsed_states.get(key)
        if cached is None or cached.revision != entry.revision:
            try:
                state = ProviderState.from_json(entry.value)
            except ValueError:
                return None  # a document we cannot read is no state at all
            if state.provider != _decode(key):
                return None
            cached = _Parsed(entry.revision, state=state)
            self._parsed_states[key] = cached
        return cached.state

    async def _tickets_doc(self, key: str) -> ProviderTickets | None:
        entry = await self._tickets.get(key)
        if entry is None:
            return None
        cached = self._parsed_tickets.get(key)
        if cached is None or cached.revision != entry.revision:
            try:
                doc = ProviderTickets.from_json(entry.value)
            except ValueError:
                return None
            cached = _Parsed(entry.revision, tickets=doc)
            self._parsed_tickets[key] = cached
        return cached.tickets


def _decode(key: str) -> str | None:
    try:
        return decode_token(key)
    except ValueError:
        return None
