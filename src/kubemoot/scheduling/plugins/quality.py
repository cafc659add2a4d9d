"""Quality: how much the crew wants this Model for this phase, independent of placement.

The sum of the rule's matching prefer weights; or, for a rule with no prefer block in
a policy with a non-empty qualityBias, the latencyClass term of the Agent's effective
bias. An explicit prefer block always wins over the bias. This is also the ``score``
of the published candidate lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from kubemoot.api import SchedulingRule
from kubemoot.scheduling.bias import LATENCY_CLASS_LABEL, latency_tier_score
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["QualityScorer", "quality_score"]


def quality_score(
    labels: Mapping[str, str],
    rule: SchedulingRule | None,
    *,
    bias: float | None,
    bias_active: bool,
) -> float:
    """The quality score of a Model with ``labels`` under ``rule`` for an Agent's bias."""
    if rule is not None and rule.prefer:
        return float(sum(term.weight for term in rule.prefer if term.selector.matches(labels)))
    if bias_active and bias is not None:
        return latency_tier_score(bias, labels.get(LATENCY_CLASS_LABEL))
    return 0.0


class QualityScorer:
    """Unbounded: prefer weights are 1–100 each and several may match."""

    name = "Quality"
    bounded = False

    def __init__(
        self, rule: SchedulingRule | None, *, bias: float | None, bias_active: bool
    ) -> None:
        self._rule = rule
        self._bias = bias
        self._active = bias_active

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(args.rule, bias=args.bias, bias_active=args.bias_active)

    def score(self, candidate: Placement, /) -> float:
        return quality_score(
            candidate.model.metadata.labels, self._rule, bias=self._bias, bias_active=self._active
        )
