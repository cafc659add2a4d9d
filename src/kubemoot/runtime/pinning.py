"""Pinned models (``Model.spec.pinned``): which provider keeps which model, which of
them a provider has lost, and loading one back as a call of its own.

A pinned copy is never an eviction victim: the provider's published state lists it in
``pinned`` and :func:`~kubemoot.runtime.eviction.idle_residents` leaves it out. An
engine may still drop it (a restart, an out-of-memory kill), so whoever probes the
provider — the operator in a cluster, a gateway for the servers of its config — loads
it back. The load is placed like any call (a ticket, so no other load lands on that
memory), confined to the pinned provider, and refused at once rather than queued when
the card is busy: the next probe round tries again.

A pin withdrawn ends the copy's forever: the pinned load asked the engine to keep it
until told otherwise, so :func:`unpin` tells it — the copy gets the keep-alive any call
gets, and the engine frees it after that much idle time as it would any copy. Nothing
is loaded for that: the request is sent only while a ticket holds the copy loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence

from kubemoot.api import Model
from kubemoot.runtime.calls import CallRefused, CallRequest, CallService
from kubemoot.runtime.placement import Action, CallPlacement, CandidateModel
from kubemoot.runtime.planner import CallPlanner
from kubemoot.store.documents import ProviderState

__all__ = ["PINNED_CALLER", "load_pinned", "missing_pinned", "pinned_by_provider", "unpin",
           "unpinned"]

log = logging.getLogger(__name__)

#: The caller name of the pinning loads (call log, dashboard).
PINNED_CALLER = "pinned"

Load = Callable[[], Awaitable[None]]
"""The caller's own load of the placed copy; raises when the engine did not load it."""


def pinned_by_provider(models: Iterable[Model]) -> dict[str, list[str]]:
    """Provider name → the model identifiers its Models pin there (sorted, unique)."""
    found: dict[str, set[str]] = {}
    for model in models:
        if model.spec.pinned:
            found.setdefault(model.spec.provider_ref, set()).add(model.spec.model)
    return {provider: sorted(ids) for provider, ids in sorted(found.items())}


def missing_pinned(states: Mapping[str, ProviderState],
                   pinned: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """``(provider, model)`` for every pinned model its *ready* provider does not hold.

    A provider that is not ready (or not probed) is left alone: a load there would fail,
    and the next probe that finds it ready asks again.
    """
    return [(provider, model)
            for provider, models in sorted(pinned.items())
            if (state := states.get(provider)) is not None and state.ready
            for model in models
            if model not in {m.name for m in state.loaded_models}]


async def load_pinned(calls: CallService, *, provider: str, model: str,
                      providers: Collection[str], load: Load) -> bool:
    """Place a load of ``model`` on ``provider`` only, run ``load``, release; whether it
    went through. A busy card refuses at once (budget 0); a failed load is logged."""
    request = CallRequest((CandidateModel(model),), agent=PINNED_CALLER,
                          thread_id=calls.thread_id(PINNED_CALLER), phase=PINNED_CALLER,
                          budget=0.0)
    try:
        call = await calls.place(request, exclude=[p for p in providers if p != provider])
    except CallRefused as refused:
        log.warning("loading pinned %s on %s did not happen now: %s; the next probe "
                    "round tries again", model, provider, refused.refusal.reason.value)
        return False
    ok = False
    try:
        await load()
        ok = True
    except Exception as error:  # an engine's failure must not stop the probe round
        log.warning("loading pinned %s on %s failed: %s; the next probe round tries "
                    "again", model, provider, error)
    finally:
        await call.close(ok=ok)
    if ok:
        log.info("loaded pinned %s on %s", model, provider)
    return ok


def unpinned(before: Mapping[str, Sequence[str]],
             after: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """``(provider, model)`` for every pin in ``before`` that ``after`` no longer has."""
    return [(provider, model) for provider, models in sorted(before.items())
            for model in sorted(set(models) - set(after.get(provider, ())))]


async def unpin(planner: CallPlanner, *, provider: str, model: str, holder: str,
                renew: Load) -> bool:
    """Give the copy of ``model`` on ``provider``, no longer pinned, the ordinary
    keep-alive: ``renew`` sends the engine that request (a load request with the
    keep-alive and no prompt, which only resets a loaded copy's timer). It is sent only
    while a zero-footprint ticket holds the copy loaded (so no plan unloads it in
    between, and the request can never load it again into memory no ticket holds);
    whether it was sent. A copy not loaded there has no forever left to end."""
    # The caller has just published the provider's state (the pin withdrawn): read it,
    # not a cached one from before the copy was loaded.
    planner.view.invalidate(provider)
    ticket = await planner.hold_copy(provider, model, holder, prompt_tokens=None)
    if ticket is None:
        return False
    try:
        await renew()
    except Exception as error:  # a probe round or reload must go on
        log.warning("giving unpinned %s on %s its ordinary keep-alive failed: %s; it "
                    "stays loaded until a call renews it", model, provider, error)
        return False
    finally:
        await planner.release(CallPlacement(Action.WARM, provider=provider, model=model,
                                            ticket=ticket))
    log.info("unpinned %s on %s: it has the ordinary keep-alive again", model, provider)
    return True
