"""The VRAM budget of one provider: the fit decision every claim is judged by.

One pure function decides whether a new ticket fits, shared by the ticket manager (at
claim time, inside the compare-and-set loop), the per-call runtime and the simulator,
so all three agree on what "fits" means. No I/O and no clock: ``now`` is passed in.

With ``usable = totalVramMiB − reserveMiB`` and ``resident`` the sum of the models the
provider reports loaded, a new ticket of ``footprint`` MiB fits when::

    committed + footprint ≤ usable − resident + credit

* ``committed`` counts active tickets whose model is not (yet) resident: a loading
  ticket holds its memory until the probe shows the model loaded, then residency
  counts it instead, so it is never counted twice.
* ``credit`` counts every distinct victim planned by an active ticket (and by the new
  one) once, and only while the provider still lists it resident. Two plans that pick
  the same victim therefore share one victim's memory, and a victim already unloaded
  gives nothing (its memory shows up as lower residency instead).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kubemoot.store.documents import ProviderState, Ticket

__all__ = [
    "budget_allows",
    "committed_mib",
    "eviction_credit_mib",
    "headroom_mib",
    "resident_mib",
    "usable_mib",
]


def _active(tickets: Iterable[Ticket], now: float) -> list[Ticket]:
    return [t for t in tickets if t.expires_at > now]


def _resident_sizes(state: ProviderState | None) -> dict[str, int]:
    if state is None:
        return {}
    sizes: dict[str, int] = {}
    for loaded in state.loaded_models:
        sizes[loaded.name] = sizes.get(loaded.name, 0) + loaded.size_mib
    return sizes


def usable_mib(state: ProviderState | None) -> int | None:
    """``totalVramMiB − reserveMiB``; ``None`` when the total is unknown."""
    if state is None or state.total_vram_mib is None:
        return None
    return state.total_vram_mib - state.reserve_mib


def resident_mib(state: ProviderState | None) -> int:
    """Memory of the models the provider reports loaded."""
    return sum(_resident_sizes(state).values())


def committed_mib(state: ProviderState | None, tickets: Sequence[Ticket], now: float) -> int:
    """Footprints of active tickets whose model the provider does not list resident yet."""
    resident = _resident_sizes(state)
    return sum(
        t.model_footprint_mib for t in _active(tickets, now) if t.model not in resident
    )


def _victims(tickets: Iterable[Ticket], now: float) -> set[str]:
    return {victim for t in _active(tickets, now) for victim in t.evicts}


def _credit(state: ProviderState | None, victims: Iterable[str]) -> int:
    resident = _resident_sizes(state)
    return sum(resident[v] for v in set(victims) if v in resident)


def eviction_credit_mib(
    state: ProviderState | None, tickets: Sequence[Ticket], now: float
) -> int:
    """Each distinct planned victim once, only while the state still lists it resident."""
    return _credit(state, _victims(tickets, now))


def headroom_mib(
    state: ProviderState | None,
    tickets: Sequence[Ticket],
    now: float,
    *,
    evicts: Mapping[str, int] | None = None,
) -> int | None:
    """What a new ticket (planning ``evicts``) may still spend; ``None``: total unknown."""
    usable = usable_mib(state)
    if usable is None:
        return None
    victims = _victims(tickets, now) | set(evicts or {})
    return (
        usable
        - resident_mib(state)
        + _credit(state, victims)
        - committed_mib(state, tickets, now)
    )


def budget_allows(
    state: ProviderState | None,
    tickets: Sequence[Ticket],
    now: float,
    *,
    footprint_mib: int,
    evicts: Mapping[str, int] | None = None,
) -> bool:
    """Whether a new ticket of ``footprint_mib`` (planning ``evicts``) fits the budget.

    A ticket that spends nothing (a call on a resident copy) always fits. With the
    total unknown nothing else does: memory that cannot be counted cannot be promised.
    """
    if footprint_mib <= 0:
        return True
    headroom = headroom_mib(state, tickets, now, evicts=evicts)
    return headroom is not None and footprint_mib <= headroom
