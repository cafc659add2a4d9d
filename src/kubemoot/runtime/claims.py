"""Claim first, then release: taking memory that idle models hold.

The ticket is claimed *before* anything is unloaded and names its victims
(``evicts``), so the budget can count their memory as credit exactly once across all
planners. Inside the compare-and-set the claim is refused when a victim picked up a
ticket of its own in the meantime (someone started using it) or is no longer
resident. Only after the claim holds are the victims unloaded through the provider
client and their residency entries dropped from the provider-state document.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kubemoot import metrics
from kubemoot.providers.protocol import ProviderClient, ProviderError
from kubemoot.runtime import faults, filters
from kubemoot.runtime.cost import Option, OptionKind
from kubemoot.runtime.selector import (
    Claim,
    ClaimCheck,
    ProviderSelector,
    Round,
    fresh_provider,
)
from kubemoot.store.documents import ProviderState, Ticket, TicketState
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, RevisionMismatch

log = logging.getLogger(__name__)

_RESIDENCY_ATTEMPTS = 5


class EvictionFailed(Exception):
    """A victim could not be unloaded; the claim was released and the call re-plans."""


def victims_idle_check(option: Option, prompt_tokens: int | None) -> ClaimCheck:
    """Inside the CAS: every victim still resident and without a ticket of its own."""

    def check(state: ProviderState | None, tickets: list[Ticket], now: float) -> bool:
        if state is None:
            return False
        p = fresh_provider(state, tickets, now)
        busy = {t.model for t in p.tickets}
        if any(v in busy or not p.is_resident(v) for v in option.victims):
            return False
        gates = [filters.ready_gate(p), filters.context_gate(p, option.model, prompt_tokens)]
        return filters.feasible(gates)

    return check


async def claim_with_evictions(
    selector: ProviderSelector,
    rnd: Round,
    option: Option,
    holder_id: str,
    *,
    states: Bucket,
    clients: Mapping[str, ProviderClient],
    state: TicketState = TicketState.LOADING,
) -> Claim | None:
    """Claim ``option`` (an unload plan), then unload its victims.

    Returns ``None`` when the claim was refused (the caller re-plans). Raises
    :class:`EvictionFailed` when an unload failed; the ticket is released first.
    """
    if option.kind is not OptionKind.UNLOAD:
        raise ValueError(f"not an unload plan: {option.kind}")
    if state is TicketState.RUNNING:
        state = TicketState.LOADING
    provider = rnd.fleet.provider(option.provider)
    assert provider is not None  # the option was made from this round
    ticket = await selector.claim_ticket(
        option, holder_id, state=state,
        check=victims_idle_check(option, rnd.prompt_tokens), evicts=option.evicts,
        provider_state=provider.state,
    )
    if ticket is None:
        return None
    client = clients.get(option.provider)
    try:
        for victim in option.victims:
            if client is not None:
                await client.unload(victim)
            await drop_residency(states, option.provider, victim)
    except ProviderError as error:
        await selector.tickets.release(option.provider, ticket.ticket_id)
        selector.view.invalidate(option.provider)
        raise EvictionFailed(str(error)) from error
    selector.view.invalidate(option.provider)
    metrics.EVICTIONS.labels(provider=option.provider).inc(len(option.victims))
    log.info("unloaded %s from %s for %s", ", ".join(option.victims), option.provider,
             option.model)
    return Claim(option, ticket, provider.state.endpoint, provider.context_for(option.model))


async def drop_residency(states: Bucket, provider: str, model: str) -> bool:
    """Remove ``model`` from the provider's loaded models by compare-and-set.

    Returns whether an entry was removed. The next probe would drop it as well; doing
    it now lets waiters see the freed memory without waiting for a probe.
    """
    key = encode_token(provider)
    for _ in range(_RESIDENCY_ATTEMPTS):
        entry = await states.get(key)
        if entry is None:
            return False
        doc = ProviderState.from_json(entry.value)
        kept = [m for m in doc.loaded_models if m.name != model]
        if len(kept) == len(doc.loaded_models):
            return False
        doc.loaded_models = kept
        try:
            await states.update(key, doc.to_json(), expected_revision=entry.revision)
        except RevisionMismatch:
            continue
        return True
    # Not an error for the call (the next probe drops the entry), but worth knowing.
    faults.noted("provider-state", faults.STORE,
                 f"dropping {model} from the state of {provider}",
                 RevisionMismatch(f"lost {_RESIDENCY_ATTEMPTS} races in a row"))
    return False
