"""Claiming a priced option: a VRAM ticket by compare-and-set, then any unloads.

:class:`Claims` turns an :class:`~kubemoot.runtime.cost.Option` of a
:class:`~kubemoot.runtime.options.Round` into a ticket through the
:class:`~kubemoot.runtime.tickets.TicketManager`. Every claim carries a condition
that re-judges the option inside the compare-and-set, against the documents being
updated, so an option that went away between pricing and claiming is refused
(``None``), never overcommitted: a copy must still be there, usable, and (unless the
call queues) have a free slot; a cold load's provider must still be ready with a
context that holds the prompt, and hold no copy of the model (calls priced on one
state would each book the one copy's footprint again; the memory itself is the
budget's to judge). The
condition is data (:class:`~kubemoot.store.documents.ClaimCondition`), so a claim that
lost a race can be announced on the claim line and granted by another process's write,
which judges the same condition (:mod:`kubemoot.runtime.conditions`).

Claim first, then release. An unload plan's ticket is claimed *before* anything is
unloaded and names its victims (``evicts``), so the budget counts their memory as
credit exactly once across all planners. Inside the compare-and-set the claim is
refused when a victim picked up a ticket of its own in the meantime (someone started
using it) or is no longer resident. The writer that grants it records which victims
no earlier live ticket planned (``evictsFirst``): this claim reports their eviction.
Only after the claim holds are the victims unloaded through the provider client and
their residency entries dropped from the provider-state document; an unload that fails
releases the ticket and counts against the provider's circuit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from kubemoot import metrics
from kubemoot.frozen import quick_init
from kubemoot.providers.protocol import ProviderClient, ProviderError
from kubemoot.runtime import faults
from kubemoot.runtime.cost import Option, OptionKind
from kubemoot.runtime.options import Round
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.runtime.tickets import Check, ClaimConflict, ClaimRejected, TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.store.documents import ClaimCondition, ProviderState, Ticket, TicketState
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, RevisionMismatch

log = logging.getLogger(__name__)

_RESIDENCY_ATTEMPTS = 5
# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read under callgrind, a module global about
# 150): the members read once or more per call are kept at module level.
_COLD_LOAD, _UNLOAD, _QUEUE = OptionKind.COLD_LOAD, OptionKind.UNLOAD, OptionKind.QUEUE
_LOADS = (_COLD_LOAD, _UNLOAD)


@quick_init
@dataclass(frozen=True, slots=True)
class Claim:
    """A ticket held on a provider for an option.

    ``evicted``: the option's victims this claim unloads *first* — those no earlier
    live ticket planned too. Two plans may share a victim (they share its memory); the
    eviction is reported once, by the claim whose ticket came first (DESIGN §9).
    """

    option: Option
    ticket: Ticket
    endpoint: str
    context_length: int | None
    evicted: tuple[str, ...] = ()


class Claims:
    """Claims options for this process's calls and keeps its provider view in step."""

    def __init__(
        self,
        view: ProviderView,
        tickets: TicketManager,
        *,
        states: Bucket,
        clients: Mapping[str, ProviderClient],
    ) -> None:
        self.view = view
        self.tickets = tickets
        self._states = states
        self._clients = clients

    async def claim(
        self, rnd: Round, option: Option, holder_id: str, *, state: TicketState
    ) -> Claim | None:
        """Claim ``option``; ``None`` when it went away (the caller prices again).

        A load (cold, or after unloads) starts its ticket ``loading`` unless it is held.
        """
        p = rnd.provider_of(option)
        if option.kind in _LOADS and (
            state is TicketState.RUNNING
        ):
            state = TicketState.LOADING
        ticket = await self.claim_ticket(
            option, holder_id, state=state, condition=condition_for(rnd, option),
            provider_state=p.state, snapshot=p,
        )
        if ticket is None:
            return None
        # The victims another ticket already planned are that ticket's evictions.
        first = set(ticket.evicts_first or ())
        ours = tuple(v for v in option.victims if v in first)
        if option.victims and not await self._unload_victims(option, ticket, ours):
            return None
        return Claim(option, ticket, p.state.endpoint, p.context_for(option.model), ours)

    async def claim_ticket(
        self,
        option: Option,
        holder_id: str,
        *,
        state: TicketState,
        condition: ClaimCondition | None = None,
        check: Check | None = None,
        provider_state: ProviderState | None = None,
        snapshot: ProviderSnapshot | None = None,
    ) -> Ticket | None:
        """The ticket of ``option`` (its footprint and victims), or ``None`` if refused.

        ``condition`` (data) and ``check`` (code, which keeps the claim off the line)
        are what must hold besides the memory. ``provider_state`` is the round's copy,
        so the claim need not read it again.
        """
        try:
            ticket = await self.tickets.claim(
                option.provider, option.model, option.footprint_mib, holder_id,
                state=state, evicts=dict(option.evicts) or None, check=check,
                condition=condition, provider_state=provider_state, snapshot=snapshot,
            )
        except (ClaimRejected, ClaimConflict):
            self.view.invalidate(option.provider)  # the state moved: read it again
            return None
        self.view.note_claimed(option.provider, ticket)
        return ticket

    async def _unload_victims(self, option: Option, ticket: Ticket,
                              ours: tuple[str, ...]) -> bool:
        """Unload the claimed plan's victims; False (ticket released) when one fails."""
        client = self._clients.get(option.provider)
        try:
            for victim in option.victims:
                if client is not None:
                    await client.unload(victim)
                await drop_residency(self._states, option.provider, victim)
        except ProviderError as error:
            await self.tickets.release(option.provider, ticket.ticket_id)
            self.view.invalidate(option.provider)
            log.warning("eviction on %s failed: %s", option.provider, error)
            circuits = self.view.circuits
            if circuits is not None:
                circuits.record_failure(option.provider)
            return False
        self.view.invalidate(option.provider)
        metrics.EVICTIONS.labels(provider=option.provider).inc(len(ours))
        log.info("unloaded %s from %s for %s", ", ".join(option.victims), option.provider,
                 option.model)
        return True


# -- the conditions judged inside the compare-and-set ------------------------------


def condition_for(rnd: Round, option: Option) -> ClaimCondition:
    """What must still hold for ``option`` when its claim is granted, in any process."""
    if option.kind is _UNLOAD:
        # every victim still resident and without a ticket, and the load still possible
        return ClaimCondition(prompt_tokens=rnd.prompt_tokens,
                              idle_victims=list(option.victims))
    if option.kind is _COLD_LOAD:
        return ClaimCondition(prompt_tokens=rnd.prompt_tokens)
    free_slot = option.kind is not _QUEUE
    return ClaimCondition(
        prompt_tokens=rnd.prompt_tokens, warm=True,
        free_slot_ahead=rnd.ahead_of(option.provider, option.model) if free_slot else None,
    )


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
