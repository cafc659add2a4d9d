"""The VRAM budget of one provider: the fit decision every claim is judged by.

One pure function decides whether a new ticket fits, shared by the ticket manager (at
claim time, inside the compare-and-set loop) and the tests that check it, so every
claim agrees on what "fits" means. No I/O and no clock: ``now`` is passed in. The
arithmetic itself (usable, resident, loading, credit) has one home,
:class:`~kubemoot.runtime.snapshot.ProviderSnapshot`; these functions judge the
documents a claim reads by building that snapshot of them.

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

from collections.abc import Mapping, Sequence

from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.store.documents import ProviderState, Ticket

__all__ = ["budget_allows", "fits", "headroom_mib"]


def headroom_mib(
    state: ProviderState | None,
    tickets: Sequence[Ticket],
    now: float,
    *,
    evicts: Mapping[str, int] | None = None,
) -> int | None:
    """What a new ticket (planning ``evicts``) may still spend; ``None``: total unknown."""
    p = ProviderSnapshot.of_documents(state, tickets, now)
    return None if p is None else p.headroom_mib(evicts or ())


def fits(footprint_mib: int, headroom: int | None) -> bool:
    """A ticket that spends nothing (a call on a resident copy) always fits. With the
    total unknown nothing else does: memory that cannot be counted cannot be promised."""
    return footprint_mib <= 0 or (headroom is not None and footprint_mib <= headroom)


def budget_allows(
    state: ProviderState | None,
    tickets: Sequence[Ticket],
    now: float,
    *,
    footprint_mib: int,
    evicts: Mapping[str, int] | None = None,
) -> bool:
    """Whether a new ticket of ``footprint_mib`` (planning ``evicts``) fits the budget."""
    if footprint_mib <= 0:
        return True
    p = ProviderSnapshot.of_documents(state, tickets, now)
    return fits(footprint_mib, None if p is None else p.headroom_mib(evicts or ()))
