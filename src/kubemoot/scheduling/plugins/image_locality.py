"""ImageLocality: a model already loaded on the provider needs no load (kube's image locality).

The scorer says 100 when loaded and 0 otherwise; the framework weighs it so the bonus
is KubemootConfig's ``imageLocalityBonus`` (default 20).
"""

from __future__ import annotations

from typing import Self

from kubemoot.scheduling.candidate import Placement, loaded_identifiers
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["ImageLocalityScorer"]


class ImageLocalityScorer:
    """Bounded 0–100."""

    name = "ImageLocality"
    bounded = True

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls()

    def score(self, candidate: Placement, /) -> float:
        return 100.0 if candidate.model_id in loaded_identifiers(candidate.provider) else 0.0
