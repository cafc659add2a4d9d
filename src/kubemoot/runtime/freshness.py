"""How old a provider's published state may be before it is no evidence of anything.

A state document says what a probe saw at ``lastProbedAt``. Its publisher (the
gateway that serves the provider, the operator's prober) probes again every
``probeIntervalSeconds``; when it stops — the process died, it lost the store — the
document stays in the bucket as it was, ``ready`` and with its copies, and every reader
would go on placing calls against a card nobody has looked at for minutes.

The capability-aware spec types this case: evidence older than the freshness policy is
STALE, never a PASS, and a decision with nothing feasible but stale candidates DEFERs
until the evidence is refreshed (it is not "impossible"). Here the policy is the
publisher's own promise: a state is stale once :data:`MISSED_PROBES` further probes
were due and none arrived, plus one probe's time (the probe may take that long before
its document is written). A state that promises nothing (no ``probeIntervalSeconds``:
written by hand, or by the simulator's publisher, which writes on every change) or
says nothing of its time (no ``lastProbedAt``) is taken as is, as the operator-side
freshness gate takes a status without ``lastProbedAt``.

A stale provider is shown not ready with its age (:class:`StaleState`), so nothing is
placed there, its readiness gate is STALE, and a call that only it could run waits for a
fresh probe within its budget, then is refused with the provider and the age
(:class:`~kubemoot.runtime.refusals.StateStale`).
"""

from __future__ import annotations

from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import ProviderState

__all__ = ["MISSED_PROBES", "StaleState", "max_age", "stale_at", "stale_view"]

#: Probes in a row that may be missed (a slow write, a store hiccup) before a state
#: counts as stale.
MISSED_PROBES = 2


class StaleState(ProviderState):
    """A provider state older than its freshness limit, as a placement sees it: not
    ready, with its age and limit. Only :func:`stale_view` makes these."""

    stale_seconds: float = 0.0
    max_age_seconds: float = 0.0


def max_age(state: ProviderState, settings: RuntimeSettings) -> float | None:
    """Seconds after ``lastProbedAt`` that ``state`` stays evidence (None: always)."""
    interval = state.probe_interval_seconds
    if interval is None or state.last_probed_at is None:
        return None
    return (MISSED_PROBES + 1) * interval + settings.probe_timeout_seconds


def stale_at(state: ProviderState, settings: RuntimeSettings) -> float | None:
    """When ``state`` turns stale on the reader's clock (None: never)."""
    limit = max_age(state, settings)
    if limit is None:
        return None
    assert state.last_probed_at is not None
    return state.last_probed_at + limit


def stale_view(shown: ProviderState, now: float, settings: RuntimeSettings) -> StaleState:
    """``shown`` (a state past its limit) as not ready, saying how old it is."""
    limit = max_age(shown, settings)
    assert limit is not None and shown.last_probed_at is not None
    age = now - shown.last_probed_at
    fields = dict(shown.__dict__)
    fields.update(
        ready=False,
        reason=(f"its state is stale: last probed {age:.0f} s ago, and its publisher "
                f"promised a probe every {shown.probe_interval_seconds:g} s "
                f"(limit {limit:.0f} s); nobody is probing it"),
    )
    return StaleState.model_construct(**fields, stale_seconds=age, max_age_seconds=limit)
