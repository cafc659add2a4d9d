"""`kubemoot place`: one per-call decision against a snapshot of the fleet.

A ``PlacementState`` document describes providers (with residents and tickets),
declared model sizes, demand and settings at an instant ``now``. It is loaded into an
embedded store and decided by the very :class:`CallPlanner` the runtime uses, on a
:class:`ManualClock` standing at ``now`` — so "why did my call queue?" is answered by
the production code, not by a re-implementation. Claims land only in the throw-away
embedded store.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Self

from pydantic import (
    AwareDatetime,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from kubemoot.api.bounds import (
    MAX_ITEMS,
    MAX_SCORE,
    ContextTokens,
    Mib,
    Parallel,
    Rate,
    Seconds,
)
from kubemoot.api.errors import InputError
from kubemoot.api.meta import EitherMibSpelling
from kubemoot.clock import ManualClock
from kubemoot.runtime.builder import build_runtime
from kubemoot.runtime.demand import DemandBoard
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.placement import CallPlacement, CandidateModel
from kubemoot.runtime.snapshot import FleetSnapshot, ProviderSnapshot
from kubemoot.settings import DEFAULTS, RuntimeSettings
from kubemoot.store.documents import (
    DemandEntry,
    ProviderState,
    ProviderTickets,
    ResidentModel,
    SelectionEntry,
    Ticket,
    TicketState,
)
from kubemoot.store.keys import encode_token, join_key
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import Bucket

KIND = "PlacementState"
# Waiters and intents of the whole snapshot: each becomes one entry in the store.
MAX_DEMAND_ENTRIES = 10_000
# How long before ``now`` a model's lastUsedAt may lie. Recent use decays exponentially;
# the stored count must grow by the same factor to decay back to recentUse, and beyond a
# day that factor leaves the range of a float (and recent use is nil anyway).
MAX_USE_AGE_SECONDS = 24 * 3600.0


class _Part(EitherMibSpelling):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class SnapshotSettings(_Part):
    load_rate_mibps: Rate = Field(DEFAULTS.load_rate_mibps, gt=0, alias="loadRateMiBps")
    unload_seconds: Seconds = Field(DEFAULTS.unload_seconds, alias="unloadSeconds")
    default_latency_seconds: Seconds = Field(
        DEFAULTS.default_latency_seconds, alias="defaultLatencySeconds"
    )
    reserve_mib: Mib = Field(DEFAULTS.reserve_mib, alias="reserveMiB")
    candidate_tolerance: Seconds = Field(DEFAULTS.candidate_tolerance, alias="candidateTolerance")


class DeclaredModel(_Part):
    name: str = Field(min_length=1)
    vram_mib: Mib | None = Field(None, alias="vramMiB")
    disk_mib: Mib | None = Field(None, alias="diskMiB")


class Resident(_Part):
    model: str = Field(min_length=1)
    size_mib: Mib = Field(alias="sizeMiB")
    context_length: ContextTokens | None = Field(None, alias="contextLength")


class SnapshotTicket(_Part):
    model: str = Field(min_length=1)
    state: TicketState = TicketState.RUNNING
    started_at: AwareDatetime = Field(alias="startedAt")
    # None: not given. A loading ticket without one is sized by occupancy(M) when loaded.
    footprint_mib: Mib | None = Field(None, alias="footprintMiB")
    evicts: dict[str, Mib] = Field(default_factory=dict, max_length=MAX_ITEMS)
    holder: str = "snapshot"
    expires_at: AwareDatetime | None = Field(None, alias="expiresAt")


class SnapshotProvider(_Part):
    name: str = Field(min_length=1)
    endpoint: str | None = None
    ready: bool = True
    total_vram_mib: Mib | None = Field(None, alias="totalVramMiB")
    reserve_mib: Mib | None = Field(None, alias="reserveMiB")
    max_parallel: Parallel = Field(1, alias="maxParallel")
    context_length: ContextTokens | None = Field(None, alias="contextLength")
    latency_seconds: Seconds | None = Field(None, alias="latencySeconds")
    residents: list[Resident] = Field(default_factory=list, max_length=MAX_ITEMS)
    tickets: list[SnapshotTicket] = Field(default_factory=list, max_length=MAX_ITEMS)


class SnapshotDemand(_Part):
    waiters: int = Field(0, ge=0, le=MAX_DEMAND_ENTRIES)
    intents: int = Field(0, ge=0, le=MAX_DEMAND_ENTRIES)
    recent_use: Rate = Field(0.0, alias="recentUse")
    prediction: Rate = 0.0
    last_used_at: AwareDatetime | None = Field(None, alias="lastUsedAt")


class PlacementState(_Part):
    """The ``kind: PlacementState`` document."""

    api_version: str = Field("kubemoot.ai/v1alpha1", alias="apiVersion")
    kind: str = KIND
    metadata: dict[str, object] = Field(default_factory=dict)
    now: AwareDatetime
    settings: SnapshotSettings = Field(default_factory=SnapshotSettings)  # type: ignore[arg-type]
    models: list[DeclaredModel] = Field(default_factory=list, max_length=MAX_ITEMS)
    providers: list[SnapshotProvider] = Field(default_factory=list, max_length=MAX_ITEMS)
    demand: dict[str, SnapshotDemand] = Field(default_factory=dict, max_length=MAX_ITEMS)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        """Checks across fields, reported at the exact field like any other problem."""
        seen: set[str] = set()
        now = _epoch(self.now)
        for index, provider in enumerate(self.providers):
            if provider.name in seen:
                raise _invalid(
                    f"provider {provider.name!r} is listed twice", "providers", index, "name"
                )
            seen.add(provider.name)
            for t_index, ticket in enumerate(provider.tickets):
                if _epoch(ticket.started_at) > now:
                    raise _invalid(
                        "a ticket cannot start after the snapshot's now",
                        "providers", index, "tickets", t_index, "startedAt",
                    )
        entries = 0
        for model, wanted in self.demand.items():
            entries += wanted.waiters + wanted.intents
            if entries > MAX_DEMAND_ENTRIES:
                raise _invalid(
                    f"waiters and intents of all models add up to more than "
                    f"{MAX_DEMAND_ENTRIES:,}", "demand", model,
                )
            if wanted.last_used_at is not None and now - _epoch(wanted.last_used_at) > \
                    MAX_USE_AGE_SECONDS:
                raise _invalid(
                    f"must be at most {MAX_USE_AGE_SECONDS:g} seconds (a day) before now; "
                    "older use has decayed to nothing (set recentUse: 0 and leave it out)",
                    "demand", model, "lastUsedAt",
                )
        return self

    def runtime_settings(self) -> RuntimeSettings:
        s = self.settings
        return RuntimeSettings().with_values({
            "load_rate_mibps": s.load_rate_mibps,
            "unload_seconds": s.unload_seconds,
            "default_latency_seconds": s.default_latency_seconds,
            "reserve_mib": s.reserve_mib,
            "candidate_tolerance": s.candidate_tolerance,
        })


def _invalid(message: str, *loc: str | int) -> ValidationError:
    """A validation error at ``loc``, so the loader names the file, document and field."""
    return ValidationError.from_exception_data(
        KIND,
        [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=None)],
    )


def load_state(path: str | Path) -> PlacementState:
    """Read and validate a snapshot file; every problem is an :class:`InputError`."""
    from kubemoot.api.loader import load_single

    return load_single(path, KIND, PlacementState)


def parse_candidates(text: str | None, model: str) -> list[CandidateModel]:
    """``--candidates`` JSON (preferred first); without it, just ``model``."""
    import json

    if text is None:
        return [CandidateModel(model)]
    try:
        data = json.loads(text)
    except ValueError as error:
        raise InputError(f"not valid JSON: {error}", field="--candidates") from None
    if not isinstance(data, list) or not data:
        raise InputError("must be a non-empty JSON list", field="--candidates")
    if len(data) > MAX_ITEMS:
        raise InputError(f"must list at most {MAX_ITEMS:,} candidates", field="--candidates")
    candidates: list[CandidateModel] = []
    for index, item in enumerate(data):
        where = f"--candidates[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("model"), str):
            raise InputError('each entry needs a "model" string', field=where)
        score = item.get("score", 0)
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise InputError('"score" must be a number', field=f"{where}.score")
        # Python's JSON reader takes NaN and Infinity, and integers of any size.
        # (comparing a huge int with a float is exact; converting it would overflow)
        if not -MAX_SCORE <= score <= MAX_SCORE:  # NaN fails every comparison
            shown = repr(score) if len(repr(score)) <= 30 else repr(score)[:27] + "..."
            raise InputError(
                f'"score" must be a finite number in [-{MAX_SCORE:g}, {MAX_SCORE:g}], '
                f"got {shown}",
                field=f"{where}.score",
            )
        candidates.append(CandidateModel(item["model"], float(score)))
    if candidates[0].model != model:
        # --model names the preferred model; keep the list's order otherwise.
        candidates = [CandidateModel(model, candidates[0].score)] + [
            c for c in candidates if c.model != model
        ]
    return candidates


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


async def decide(
    state: PlacementState,
    candidates: Sequence[CandidateModel],
    *,
    prompt_tokens: int | None = None,
) -> CallPlacement:
    """Load the snapshot into an embedded store and place one call there."""
    now = _epoch(state.now)
    settings = state.runtime_settings()
    clock = ManualClock(now)
    kv = MemoryKV(clock=clock)
    try:
        runtime = await build_runtime(
            kv, clock=clock, settings=settings,
            declared={m.name: m.vram_mib for m in state.models if m.vram_mib is not None},
        )
        disk = {m.name: m.disk_mib for m in state.models if m.disk_mib is not None}
        docs = [_provider_docs(p, settings, now, disk) for p in state.providers]
        docs = _size_loading_tickets(state, docs, runtime.occupancy, now)
        for provider, (doc, docs_tickets) in zip(state.providers, docs, strict=True):
            await runtime.states.put(encode_token(provider.name), doc.to_json())
            await runtime.tickets_bucket.put(encode_token(provider.name),
                                             docs_tickets.to_json())
            if provider.latency_seconds is not None:
                runtime.latency.observe(doc.endpoint, provider.latency_seconds)
        await _write_demand(runtime.board, runtime.demand_bucket, state, now)
        # One decision at one instant: nothing to follow, nothing to wait on.
        return await runtime.planner.place(
            candidates, holder_id="kubemoot-place", prompt_tokens=prompt_tokens, explain=True
        )
    finally:
        await kv.close()



def _provider_docs(
    provider: SnapshotProvider,
    settings: RuntimeSettings,
    now: float,
    disk: dict[str, int],
) -> tuple[ProviderState, ProviderTickets]:
    state = ProviderState(
        provider=provider.name,
        endpoint=provider.endpoint or f"http://{provider.name}:11434",
        ready=provider.ready,
        last_probed_at=now,
        total_vram_mib=provider.total_vram_mib,
        reserve_mib=provider.reserve_mib if provider.reserve_mib is not None
        else settings.reserve_mib,
        max_parallel=provider.max_parallel,
        context_length=provider.context_length,
        loaded_models=[
            ResidentModel(name=r.model, size_mib=r.size_mib, context_length=r.context_length)
            for r in provider.residents
        ],
        loaded_model_footprints={r.model: r.size_mib for r in provider.residents},
        disk_sizes_mib=dict(disk),
    )
    tickets = ProviderTickets(
        provider=provider.name,
        tickets=[
            Ticket(
                ticket_id=f"snapshot-{provider.name}-{i}",
                model=t.model,
                model_footprint_mib=t.footprint_mib or 0,
                holder_id=t.holder,
                state=t.state,
                started_at=_epoch(t.started_at),
                expires_at=_epoch(t.expires_at) if t.expires_at is not None
                else now + settings.ticket_ttl_seconds,
                evicts=dict(t.evicts),
            )
            for i, t in enumerate(provider.tickets)
        ],
    )
    return state, tickets


def _size_loading_tickets(
    state: PlacementState,
    docs: list[tuple[ProviderState, ProviderTickets]],
    occupancy: OccupancyBook,
    now: float,
) -> list[tuple[ProviderState, ProviderTickets]]:
    """Give a ``loading`` ticket written without ``footprintMiB`` the size occupancy(M) has.

    A load always takes memory, so the first such ticket of a model on a provider (with
    no resident copy and no other ticket sized for it) stands for occupancy(M): observed
    (a resident copy anywhere, else another loading ticket's footprint), then declared,
    then estimated. Later ones join that load and spend nothing. An explicit
    ``footprintMiB: 0`` is taken as written (a call joining another's load). When nothing
    knows M, the ticket stays without a footprint; the runtime still counts it as a copy
    being loaded, with an unknown remaining time (see :meth:`CostModel.load_ends_at`).
    """
    fleet = FleetSnapshot.of(now, [ProviderSnapshot(s, tuple(t.tickets)) for s, t in docs])
    sized: list[tuple[ProviderState, ProviderTickets]] = []
    for provider, (doc, doc_tickets) in zip(state.providers, docs, strict=True):
        snapshot = fleet.provider(provider.name)
        assert snapshot is not None  # built from these very documents
        tickets = list(doc_tickets.tickets)
        unsized = [
            i for i, t in enumerate(provider.tickets)
            if t.state is TicketState.LOADING and t.footprint_mib is None
            and not snapshot.is_resident(t.model) and snapshot.load_mib(t.model) is None
        ]
        done: set[str] = set()
        for i in sorted(unsized, key=lambda i: (provider.tickets[i].started_at, i)):
            model = tickets[i].model
            if model in done:
                continue  # a later call joining the same load
            done.add(model)
            mib = occupancy.occupancy(model, fleet)
            if mib:
                tickets[i] = tickets[i].model_copy(update={"model_footprint_mib": mib})
        sized.append((doc, doc_tickets.model_copy(update={"tickets": tickets})))
    return sized


async def _write_demand(
    board: DemandBoard, bucket: Bucket, state: PlacementState, now: float
) -> None:
    for model, wanted in sorted(state.demand.items()):
        for i in range(wanted.waiters):
            await board.add_waiter(model, f"snapshot/waiter-{i}")
        for i in range(wanted.intents):
            await board.add_intent(model, f"snapshot/intent-{i}")
        if wanted.recent_use > 0 or wanted.last_used_at is not None:
            last = _epoch(wanted.last_used_at) if wanted.last_used_at is not None else now
            # Stored so that the board's decay brings it back to exactly recentUse now.
            count = wanted.recent_use * math.exp((now - last) / board.use_window_seconds)
            entry = DemandEntry(expires_at=now + board.selection_ttl_seconds, count=count,
                                last_used_at=last)
            await bucket.put(join_key("use", model), entry.to_json())
        if wanted.prediction > 0:
            selection = SelectionEntry(expires_at=now + board.selection_ttl_seconds, models=[model],
                                       frequency=wanted.prediction)
            await bucket.put(join_key("sel", f"snapshot/forecast-{model}"), selection.to_json())
