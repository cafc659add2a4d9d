"""ProviderWeight: heavy rigs take mulling, light rigs take triage.

``spec.scheduling.weight`` (default 100) is added for mulling and subtracted for triage,
so two rigs carrying identically labelled Models split the phases without per-rig
labels. Other phases get no term.
"""

from __future__ import annotations

from typing import Self

from kubemoot.api import Phase
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["PHASE_SIGN", "ProviderWeightScorer"]

PHASE_SIGN: dict[str, float] = {Phase.MULLING: 1.0, Phase.TRIAGE: -1.0}


class ProviderWeightScorer:
    """Unbounded and signed."""

    name = "ProviderWeight"
    bounded = False

    def __init__(self, phase: str) -> None:
        self._sign = PHASE_SIGN.get(phase, 0.0)

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(args.phase)

    def score(self, candidate: Placement, /) -> float:
        provider = candidate.provider
        if provider is None or not self._sign:
            return 0.0
        return self._sign * provider.spec.scheduling.weight
