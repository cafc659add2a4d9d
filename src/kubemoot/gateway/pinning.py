"""Pinned models: loaded at start, and loaded again whenever their server lost them.

A pinned copy is never an eviction victim (the provider's published state lists it, and
:func:`~kubemoot.runtime.eviction.idle_residents` leaves it out), but an engine may
still drop it: a restart, an out-of-memory kill, a keep-alive a client set. So on every
probe tick the gateway loads each pinned model its server does not hold, as a call of
its own: placed by the same planner (a ticket, so no other load lands on that memory),
confined to the pinned server, and refused at once rather than queued when the card is
busy — the next tick tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from kubemoot.gateway.calls import CallDesk, PlacedCall
from kubemoot.gateway.errors import GatewayError
from kubemoot.gateway.requests import InferenceRequest
from kubemoot.runtime.calls import CallRefused
from kubemoot.runtime.pinning import PINNED_CALLER, missing_pinned
from kubemoot.runtime.placement import CandidateModel
from kubemoot.store.documents import ProviderState

__all__ = ["PINNED_CALLER", "load_missing_pinned"]

log = logging.getLogger(__name__)



async def load_missing_pinned(desk: CallDesk, states: Mapping[str, ProviderState],
                              pinned: Mapping[str, Sequence[str]]) -> list[str]:
    """Load every pinned model its ready server does not hold; ``provider/model`` of
    each load that went through."""
    loads = missing_pinned(states, pinned)
    done = await asyncio.gather(*(_load(desk, provider, model, list(states))
                                  for provider, model in loads))
    return [f"{p}/{m}" for (p, m), ok in zip(loads, done, strict=True) if ok]


async def _load(desk: CallDesk, provider: str, model: str, providers: list[str]) -> bool:
    req = InferenceRequest.parse("generate", {"model": model, "stream": False})
    request = desk.request(req, [CandidateModel(model)], caller=PINNED_CALLER, budget=0.0,
                           left=asyncio.Event())
    try:
        # confined to the pinned server: every other provider is excluded
        active = await desk.calls.place(request,
                                        exclude=[p for p in providers if p != provider])
    except CallRefused as refused:
        log.warning("gateway: loading pinned %s on %s did not happen now: %s; the next "
                    "probe tries again", model, provider, refused.refusal.reason.value)
        return False
    call = PlacedCall(desk, req, active)
    desk.in_flight.add(call)
    try:
        # keep_alive -1: the engine holds it until told otherwise (never past the cap a
        # client's keep_alive gets: a pin is the operator's word, not a client's)
        await call.open("/api/generate", {"model": model, "keep_alive": -1,
                                          "stream": False})
        await call.json()  # closes the call: the ticket goes back, the copy stays
    except GatewayError as error:
        await call.close(ok=False)
        log.warning("gateway: loading pinned %s on %s did not happen now: %s; the next "
                    "probe tries again", model, provider, error.message)
        return False
    log.info("gateway: loaded pinned %s on %s", model, provider)
    return True
