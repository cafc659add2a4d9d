"""The dashboard's picture of the fleet, kept current from KV watches.

:class:`FleetView` mirrors the three shared-state buckets and the call log in memory:
it reads every key once, then applies each watched change. Watches start *before* the
first read and every change carries its revision, so a change that raced the read is
neither lost nor applied twice. :meth:`FleetView.snapshot` turns the mirror into the
JSON the page draws; everything time-dependent (expiry, staleness, ages) is judged
there against the injected clock, because expiry produces no watch event.

A watch alone cannot tell a quiet fleet from a lost store, so the view also asks the
store a cheap question every ``check_seconds`` (:class:`~kubemoot.store.health.StoreHealth`;
the dashboard server turns this on). When it gets no answer in time, the snapshot says
since when the store is lost (the page shows it, ``/healthz`` fails); when answers come
back, the view reads every
bucket again (a deletion made meanwhile would otherwise stay on the page), restarts
any watch that ended, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kubemoot.clock import Clock
from kubemoot.dashboard.calllog import CALL_LOG_BUCKET, CALL_LOG_MAX_AGE_SECONDS, CallEntry
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.store.documents import (
    MODEL_DEMAND_BUCKET,
    MODEL_DEMAND_MAX_AGE_SECONDS,
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    DemandEntry,
    ProviderState,
    ProviderTickets,
    SelectionEntry,
    Ticket,
    TicketState,
)
from kubemoot.store.health import StoreHealth
from kubemoot.store.keys import decode_token
from kubemoot.store.protocol import KV, Bucket, Change, StoreError, Watch

__all__ = ["DEFAULT_FRESHNESS_SECONDS", "FleetView"]

log = logging.getLogger(__name__)

DEFAULT_FRESHNESS_SECONDS = 120.0  # DESIGN §4: freshness.maxAgeSeconds
RECENT_CALLS_PER_AGENT = 8
SEEN_CALL_KEYS = 10_000  # enough to recognise a duplicate from the start-up race


@dataclass(slots=True)
class _Mirror:
    """One bucket's keys, values and the revision each was seen at."""

    values: dict[str, bytes] = field(default_factory=dict)
    revisions: dict[str, int] = field(default_factory=dict)

    def apply(self, key: str, value: bytes | None, revision: int) -> bool:
        if revision <= self.revisions.get(key, 0):
            return False  # already seen (the initial read raced the watch)
        self.revisions[key] = revision
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value
        return True


class FleetView:
    """A live, read-only mirror of shared state for one dashboard process."""

    def __init__(
        self, kv: KV, *, clock: Clock, freshness_seconds: float | None = None,
        check_seconds: float | None = None,
    ) -> None:
        self._kv = kv
        self._clock = clock
        # None: no checks (a view on a manual clock in a test would spin its clock).
        self.check_seconds = check_seconds or 0.0
        self._buckets: list[Bucket] = []
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._health: StoreHealth | None = None
        self.freshness_seconds = (
            DEFAULT_FRESHNESS_SECONDS if freshness_seconds is None else freshness_seconds
        )
        self._mirrors: dict[str, _Mirror] = {}
        self._calls: dict[str, deque[CallEntry]] = defaultdict(
            lambda: deque(maxlen=RECENT_CALLS_PER_AGENT)
        )
        self._totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._seen_calls: dict[str, None] = {}  # insertion-ordered, bounded
        self._watches: list[Watch] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[Callable[[], None]] = []
        self.version = 0  # moves on every applied change; the page's cue to redraw

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the buckets, start the watches, then read what is there."""
        buckets = [
            await self._kv.bucket(PROVIDER_STATE_BUCKET),
            await self._kv.bucket(PROVIDER_TICKETS_BUCKET),
            await self._kv.bucket(MODEL_DEMAND_BUCKET, max_age=MODEL_DEMAND_MAX_AGE_SECONDS),
            await self._kv.bucket(CALL_LOG_BUCKET, max_age=CALL_LOG_MAX_AGE_SECONDS),
        ]
        self._buckets = buckets
        for bucket in buckets:
            self._mirrors[bucket.name] = _Mirror()
            await self._start_watch(bucket)
        for bucket in buckets:
            await self._read_all(bucket)
        self._changed()
        if self.check_seconds > 0:
            self._health = StoreHealth(buckets[0], clock=self._clock, every=self.check_seconds)
            self._health.on_change(self._store_changed)
            self._tasks.append(asyncio.get_running_loop().create_task(self._health.run()))

    async def _start_watch(self, bucket: Bucket) -> None:
        watch = bucket.watch()
        await watch.ready()
        self._watches.append(watch)
        task = asyncio.get_running_loop().create_task(self._follow(watch))
        self._tasks.append(task)
        self._followers[bucket.name] = task

    async def close(self) -> None:
        for watch in self._watches:
            with contextlib.suppress(StoreError):
                await watch.aclose()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StoreError):
                await task
        self._watches.clear()
        self._tasks.clear()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every applied change (must not block)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    async def _read_all(self, bucket: Bucket) -> None:
        keys = await bucket.keys()
        mirror = self._mirrors[bucket.name]
        for gone in set(mirror.values) - set(keys):  # deleted while nobody watched
            del mirror.values[gone]
        for key in keys:
            entry = await bucket.get(key)
            if entry is not None:
                self._apply(Change(bucket.name, key, entry.value, entry.revision))

    # -- is the store there? ---------------------------------------------------------

    def store_status(self) -> dict[str, Any]:
        """``reachable``, and while it is not, ``lostSince`` and ``reason``."""
        health = self._health
        if health is None or health.reachable:
            return {"reachable": True, "lostSince": None, "reason": None}
        return {"reachable": False, "lostSince": health.lost_since, "reason": health.reason}

    async def _store_changed(self, health: StoreHealth) -> None:
        if health.reachable:
            # Catch up with what changed while the store was away (a StoreError here
            # keeps it lost; the next check tries again).
            for bucket in self._buckets:
                if self._followers[bucket.name].done():
                    await self._start_watch(bucket)
                await self._read_all(bucket)
            log.warning("shared state answers again")
        else:
            log.warning("shared state unreachable: %s", health.reason)
        self._changed()

    async def _follow(self, watch: Watch) -> None:
        try:
            async for change in watch:
                if self._apply(change):
                    self._changed()
        except StoreError as error:  # the store went away: keep showing the last picture
            log.warning("dashboard watch ended: %s", error)

    def _apply(self, change: Change) -> bool:
        if change.bucket == CALL_LOG_BUCKET:
            # Call-log keys are written once each: fold them into the summary instead of
            # mirroring a log that only grows.
            return change.value is not None and self._add_call(change.key, change.value)
        mirror = self._mirrors[change.bucket]
        return mirror.apply(change.key, change.value, change.revision)

    def _add_call(self, key: str, value: bytes) -> bool:
        if key in self._seen_calls:
            return False  # the first read and the watch both delivered it
        try:
            entry = CallEntry.from_json(value)
        except ValidationError as error:
            log.warning("call log entry %s unreadable: %s", key, error)
            return False
        self._seen_calls[key] = None
        if len(self._seen_calls) > SEEN_CALL_KEYS:
            del self._seen_calls[next(iter(self._seen_calls))]  # forget the oldest
        self._calls[entry.agent].append(entry)
        totals = self._totals[entry.agent]
        totals["calls"] += 1
        totals["evictions"] += len(entry.evicted)
        totals["waitedSeconds"] += entry.waited_seconds
        return True

    def _changed(self) -> None:
        self.version += 1
        for listener in list(self._listeners):
            listener()

    # -- the page's data -------------------------------------------------------------

    def _docs(self, bucket: str) -> dict[str, bytes]:
        mirror = self._mirrors.get(bucket)
        return dict(mirror.values) if mirror is not None else {}

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, JSON-ready and camelCase."""
        now = self._clock.now()
        tickets = self._active_tickets(now)
        return {
            "now": now,
            "version": self.version,
            "freshnessSeconds": self.freshness_seconds,
            "store": self.store_status(),
            "providers": self._providers(now, tickets),
            "tickets": [
                {"provider": provider, **t.model_dump(by_alias=True, mode="json")}
                for provider, ts in tickets.items() for t in ts
            ],
            "demand": self._demand(now),
            "agents": self._agents(),
        }

    def _active_tickets(self, now: float) -> dict[str, list[Ticket]]:
        """Each provider's unexpired tickets, oldest first."""
        out: dict[str, list[Ticket]] = {}
        for key, raw in sorted(self._docs(PROVIDER_TICKETS_BUCKET).items()):
            try:
                doc = ProviderTickets.from_json(raw)
            except ValidationError:
                log.warning("ticket document %s unreadable", key)
                continue
            out[doc.provider] = sorted(doc.active(now), key=lambda t: t.started_at)
        return out

    def _providers(
        self, now: float, tickets: dict[str, list[Ticket]]
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for key, raw in sorted(self._docs(PROVIDER_STATE_BUCKET).items()):
            try:
                state = ProviderState.from_json(raw)
            except ValidationError:
                log.warning("provider state %s unreadable", key)
                continue
            out.append(self._provider(state, tickets.get(state.provider, []), now))
        return out

    def _provider(
        self, state: ProviderState, tickets: list[Ticket], now: float
    ) -> dict[str, Any]:
        # The runtime's own arithmetic (usable, resident, loading, free), so the page
        # shows the memory the planner sees; tickets are already the active ones.
        snap = ProviderSnapshot(state=state, tickets=tuple(tickets))
        resident = snap.residents
        # A ticket with a footprint spends new VRAM for a copy the last probe did not see
        # resident yet (held for a plan, loading, or running before the next probe).
        loading = [
            {"model": t.model, "mib": t.model_footprint_mib, "state": t.state.value}
            for t in tickets
            if t.model_footprint_mib > 0 and t.model not in resident
        ]
        total = state.total_vram_mib
        # An unload plan in flight counts its new model before its victims leave, so
        # free can dip below zero for a moment; the page draws that as none free.
        free = None if snap.free_mib is None else max(0, snap.free_mib)
        age = None if state.last_probed_at is None else max(0.0, now - state.last_probed_at)
        running: dict[str, int] = defaultdict(int)
        for t in tickets:
            if t.state in (TicketState.RUNNING, TicketState.LOADING):
                running[t.model] += 1
        models = [
            {"name": name, "sizeMiB": mib, "inUse": running.get(name, 0)}
            for name, mib in sorted(resident.items())
        ]
        return {
            "provider": state.provider,
            "endpoint": state.endpoint,
            "ready": state.ready,
            "reason": state.reason,
            "lastProbedAt": state.last_probed_at,
            "ageSeconds": age,
            "stale": age is not None and age > self.freshness_seconds,
            "totalVramMiB": total,
            "reserveMiB": state.reserve_mib,
            "residentMiB": snap.resident_total,
            "loadingMiB": snap.loading_mib,
            "freeMiB": free,
            "maxParallel": state.max_parallel,
            "slotsInUse": sum(running.values()),
            "slotsTotal": state.max_parallel * max(1, len(resident)),
            "contextLength": state.context_length,
            "models": models,
            "loading": loading,
        }

    def _demand(self, now: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for key, raw in sorted(self._docs(MODEL_DEMAND_BUCKET).items()):
            kind, _, rest = key.partition(".")
            try:
                if kind == "sel":
                    sel = SelectionEntry.from_json(raw)
                    if sel.expires_at > now:
                        out.append({"kind": kind, "agent": decode_token(rest),
                                    "models": sel.models, "frequency": sel.frequency})
                    continue
                entry = DemandEntry.from_json(raw)
                model_token, _, agent_token = rest.partition(".")
                if entry.expires_at > now:
                    out.append({
                        "kind": kind, "model": decode_token(model_token),
                        "agent": decode_token(agent_token) if agent_token else None,
                        "count": round(entry.count, 3),
                    })
            except (ValidationError, ValueError):
                log.warning("demand entry %s unreadable", key)
        return out

    def _agents(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for agent in sorted(self._calls):
            recent = list(self._calls[agent])
            totals = self._totals[agent]
            out.append({
                "agent": agent,
                "calls": int(totals["calls"]),
                "evictions": int(totals["evictions"]),
                "waitedSeconds": round(totals["waitedSeconds"], 3),
                "recent": [c.to_dict() for c in reversed(recent)],  # newest first
            })
        return out
