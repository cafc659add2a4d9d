"""Capacity: rank providers by their free VRAM, never models by their size.

``spread`` (the default) gives 100·free/total, ``binpack`` 100·(1 − free/total). Only the
provider's own report counts, so two Models on one card score the same here.
"""

from __future__ import annotations

from typing import Literal, Self

from kubemoot.scheduling.candidate import Placement, free_vram
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["CapacityScorer"]


class CapacityScorer:
    """Bounded 0–100; a provider with no VRAM total (or a zero one) scores 0."""

    name = "Capacity"
    bounded = True

    def __init__(self, strategy: Literal["spread", "binpack"] = "spread") -> None:
        self._strategy = strategy

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(args.settings.strategy)

    def score(self, candidate: Placement, /) -> float:
        room = free_vram(candidate.provider)
        if room is None or room[1] == 0:
            return 0.0
        free, total = room
        share = free / total
        return 100.0 * (share if self._strategy == "spread" else 1.0 - share)
