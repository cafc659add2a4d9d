"""Builders of shared-state documents for table tests: provider states and tickets.

One home for the documents every layer's tests write into the store (runtime,
store, dashboard, operator), so a new field of :class:`ProviderState` or
:class:`Ticket` is learnt in one place. Sizes read in GiB by default, because the
spec's worked examples are in GiB; every builder also takes exact MiB.

    gpu("a", 32, residents={"qwen3:32b": 27})          # a 32 GiB card, one model warm
    provider_state("gpu-a", usable_mib=20480)           # exact MiB, reserve on top
    ticket("qwen3:14b", age=5, footprint_gib=12)        # a call 5 s into its run
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubemoot.settings import DEFAULTS
from kubemoot.store.documents import ProviderState, ResidentModel, Ticket, TicketState

__all__ = ["GIB", "NOW", "gpu", "provider_state", "ticket"]

#: A fixed "now" (Unix seconds) that table tests share, so times read as offsets.
NOW = 1_800_000_000.0
GIB = 1024


def provider_state(
    name: str = "gpu-a",
    *,
    total_mib: int | None = None,
    usable_mib: int | None = None,
    loaded: Mapping[str, int] | None = None,
    loaded_context: Mapping[str, int] | None = None,
    digests: Mapping[str, str] | None = None,
    ready: bool = True,
    reason: str | None = None,
    slots: int = 1,
    context: int | None = None,
    probed_at: float | None = None,
    endpoint: str | None = None,
    **extra: Any,
) -> ProviderState:
    """A provider's published state, sizes in MiB.

    ``usable_mib`` is the total less the default reserve (give one or neither of
    ``total_mib`` and ``usable_mib``; neither leaves the total unknown). ``loaded``
    maps resident models to their size (``loaded_context`` and ``digests`` add their
    context and digest); ``extra`` sets any other field.
    """
    if total_mib is not None and usable_mib is not None:
        raise ValueError("give total_mib or usable_mib, not both")
    if usable_mib is not None:
        total_mib = usable_mib + DEFAULTS.reserve_mib
    contexts, digest = loaded_context or {}, digests or {}
    return ProviderState(
        provider=name,
        endpoint=endpoint or f"http://{name}:11434",
        ready=ready,
        reason=reason,
        last_probed_at=probed_at,
        total_vram_mib=total_mib,
        max_parallel=slots,
        context_length=context,
        loaded_models=[
            ResidentModel(name=m, size_mib=size, context_length=contexts.get(m),
                        digest=digest.get(m))
            for m, size in (loaded or {}).items()
        ],
        **extra,
    )


def gpu(
    name: str,
    total_gib: float | None,
    *,
    residents: Mapping[str, float] | None = None,
    ready: bool = True,
    slots: int = 1,
    context: int | None = None,
    resident_context: Mapping[str, int] | None = None,
) -> ProviderState:
    """:func:`provider_state` with the total and the residents in GiB."""
    return provider_state(
        name,
        total_mib=None if total_gib is None else int(total_gib * GIB),
        loaded={m: int(g * GIB) for m, g in (residents or {}).items()},
        loaded_context=resident_context,
        ready=ready,
        slots=slots,
        context=context,
    )


def ticket(
    model: str,
    *,
    age: float = 0.0,
    state: TicketState = TicketState.RUNNING,
    footprint_gib: float = 0.0,
    footprint_mib: int | None = None,
    evicts: Mapping[str, float] | None = None,
    ident: str | None = None,
    holder_id: str = "someone-else",
    now: float = NOW,
    ttl_seconds: float = DEFAULTS.ticket_ttl_seconds,
) -> Ticket:
    """A ticket started ``age`` seconds before ``now`` that expires ``ttl_seconds`` after it.

    The footprint is ``footprint_mib`` when given, else ``footprint_gib``; ``evicts``
    maps victims to their size in GiB. The default id differs for tickets that differ.
    """
    victims = {m: int(g * GIB) for m, g in (evicts or {}).items()}
    footprint = int(footprint_gib * GIB) if footprint_mib is None else footprint_mib
    return Ticket(
        ticket_id=ident or f"t-{model}-{age}-{state.value}-{footprint}-{sorted(victims)}",
        model=model,
        model_footprint_mib=footprint,
        holder_id=holder_id,
        state=state,
        started_at=now - age,
        expires_at=now + ttl_seconds,
        evicts=victims,
    )
