"""Choosing which idle models to unload to make room for a load.

A victim must be idle: no live ticket on the provider is using it, and no other ticket
has already claimed its memory as a victim; a copy pinned to its provider is never one.
Live work is never unloaded, whatever the cost. The planner prefers the smallest set of
victims that frees enough memory; when several sets are equally small it keeps the
models that are wanted most, ranking by waiting agents, then intents, then recent use
plus forecast, then how recently each was used. Models somebody is waiting for are only
touched if no other set frees enough.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

from kubemoot.runtime.snapshot import DemandSnapshot, ModelDemand, ProviderSnapshot

#: Above this many idle residents the planner stops enumerating subsets and takes the
#: largest models greedily (still the fewest victims, but not the least-needed set).
_ENUMERATION_LIMIT = 16


def idle_residents(p: ProviderSnapshot, *, exclude: str | None = None) -> dict[str, int]:
    """Resident models with no ticket on ``p``, not planned for release already, and not
    pinned to ``p`` (a pinned copy is never a victim, however idle)."""
    busy = {t.model for t in p.tickets}
    planned = p.planned_victims()
    pinned = set(p.state.pinned)
    return {
        model: mib
        for model, mib in p.residents.items()
        if model not in busy and model not in planned and model not in pinned
        and model != exclude
    }


def demand_key(model: str, wanted: ModelDemand) -> tuple[int, int, float, float, str]:
    """Least wanted sorts first; a model never used counts as least recently used."""
    last = wanted.last_used_at if wanted.last_used_at is not None else float("-inf")
    return (wanted.waiters, wanted.intents, wanted.recent_use + wanted.prediction, last, model)


class EvictionPlanner:
    """Picks victims on one provider."""

    def __init__(self, demand: DemandSnapshot) -> None:
        self._demand = demand

    def choose_victims(
        self, candidates: Mapping[str, int], needed_mib: int
    ) -> tuple[str, ...] | None:
        """The victims to unload to free ``needed_mib``, or ``None`` when none can.

        ``candidates`` are the idle residents (model → MiB). ``needed_mib ≤ 0`` needs none.
        """
        if needed_mib <= 0:
            return ()
        keys = {m: demand_key(m, self._demand.of(m)) for m in candidates}
        unwaited = {m: mib for m, mib in candidates.items() if self._demand.of(m).waiters == 0}
        for pool in (unwaited, dict(candidates)):
            chosen = self._fewest_least_needed(pool, needed_mib, keys)
            if chosen is not None:
                return chosen
        return None

    @staticmethod
    def _fewest_least_needed(
        pool: Mapping[str, int],
        needed_mib: int,
        keys: Mapping[str, tuple[int, int, float, float, str]],
    ) -> tuple[str, ...] | None:
        if sum(pool.values()) < needed_mib:
            return None
        # The k largest models free the most memory any k victims can, so the smallest k
        # for which they suffice is the fewest victims possible.
        by_size = sorted(pool, key=lambda m: (-pool[m], m))
        count, freed = 0, 0
        while freed < needed_mib:
            freed += pool[by_size[count]]
            count += 1
        if len(pool) > _ENUMERATION_LIMIT:
            return _least_needed_order(by_size[:count], keys)
        best: tuple[str, ...] | None = None
        best_rank: list[tuple[int, int, float, float, str]] | None = None
        for subset in combinations(sorted(pool), count):
            if sum(pool[m] for m in subset) < needed_mib:
                continue
            # Compare sets by their most-needed member first, then the next, and so on.
            rank = sorted((keys[m] for m in subset), reverse=True)
            if best_rank is None or rank < best_rank:
                best, best_rank = _least_needed_order(subset, keys), rank
        return best


def _least_needed_order(
    models: Sequence[str], keys: Mapping[str, tuple[int, int, float, float, str]]
) -> tuple[str, ...]:
    return tuple(sorted(models, key=lambda m: keys[m]))
