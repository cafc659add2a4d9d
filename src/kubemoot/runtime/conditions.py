"""Judging a claim's condition: pure, the same in every process.

A :class:`~kubemoot.store.documents.ClaimCondition` is what the runtime's claims used
to carry as code ("the copy still has a free slot", "the victims are still idle").
As data it travels in an announced request, and whichever writer applies the request
judges it here, against the documents it is about to write, with the very gates the
runtime priced the option with (:mod:`kubemoot.runtime.filters`). Inside a claim the
provider's circuit is not known (circuits are each process's own), so the circuit gate
passes; the claimer priced the option with its own circuits before claiming.
"""

from __future__ import annotations

from kubemoot.runtime import filters
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.store.documents import ClaimCondition

__all__ = ["holds"]


def holds(condition: ClaimCondition, p: ProviderSnapshot | None, model: str) -> bool:
    """Whether ``condition`` holds for a claim of ``model`` on the provider ``p``.

    The provider must be ready in every case; a provider without a state holds no
    condition, since nothing about it is known.
    """
    if p is None:
        return False
    if condition.idle_victims:
        busy = {t.model for t in p.tickets}
        # a lapsing victim counts: its memory is still held, and unloading it frees it
        if any(v in busy or not p.holds(v) for v in condition.idle_victims):
            return False
    if condition.warm:
        # The gates' verdict without building their evidence: every writer judges
        # every announced claim's condition on each write.
        if not p.has_copy(model) or not filters.warm_ok(p, model, condition.prompt_tokens):
            return False
    elif not condition.idle_victims and p.has_copy(model):
        # A cold load was priced where the model had no copy. Calls placed in one
        # instant all price on the same state, and each such claim would book the
        # model's whole footprint again for the one copy the engine loads; refused,
        # the call prices again and sees the copy that is coming.
        return False
    elif not filters.feasible([filters.ready_gate(p),  # a load: the memory is the budget's
                               filters.context_gate(p, model, condition.prompt_tokens)]):
        return False
    ahead = condition.free_slot_ahead
    return ahead is None or p.has_free_slot(model, ahead=ahead)
