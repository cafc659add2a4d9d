"""Scoring policy ``capability-score/v1``: preferences among feasible nodes only.

Three bounded scorers (0–100 each), weighted so the total is also 0–100:

* ``locality`` (weight 0.4): 100 with a VERIFIED replica of the exact digest on the
  node (no transfer, quicker start), else 0;
* ``queueDepth`` (weight 0.3): ``100 / (1 + queueDepth)`` — an empty queue scores 100;
* ``utilization`` (weight 0.3): ``100 · (1 − utilization)``.

Telemetry that is absent earns no points: an unmeasured node is not preferred over a
measured idle one. The engine runs these only on nodes that passed every gate, so no
score ever compensates for a failed gate. Ties go to the node name.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubemoot.capability.gates import NodeCandidate, has_verified_replica
from kubemoot.capability.model import Workload
from kubemoot.gates import Weighted

__all__ = [
    "LOCALITY_WEIGHT",
    "QUEUE_WEIGHT",
    "SCORING_POLICY_VERSION",
    "UTILIZATION_WEIGHT",
    "LocalityScorer",
    "QueueDepthScorer",
    "UtilizationScorer",
    "scoring_policy",
]

SCORING_POLICY_VERSION = "capability-score/v1"
LOCALITY_WEIGHT = 0.4
QUEUE_WEIGHT = 0.3
UTILIZATION_WEIGHT = 0.3


class LocalityScorer:
    """100 when the exact artifact is already on the node and VERIFIED."""

    name = "locality"

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def score(self, candidate: NodeCandidate, /) -> float:
        return 100.0 if has_verified_replica(candidate.node, self.workload) else 0.0


class QueueDepthScorer:
    """Shorter queues score higher; unknown queue depth scores 0."""

    name = "queueDepth"

    def score(self, candidate: NodeCandidate, /) -> float:
        telemetry = candidate.node.telemetry
        if telemetry is None or telemetry.queue_depth is None:
            return 0.0
        return 100.0 / (1 + telemetry.queue_depth)


class UtilizationScorer:
    """Less busy devices score higher; unknown utilization scores 0."""

    name = "utilization"

    def score(self, candidate: NodeCandidate, /) -> float:
        telemetry = candidate.node.telemetry
        if telemetry is None or telemetry.utilization is None:
            return 0.0
        return 100.0 * (1.0 - telemetry.utilization)


def scoring_policy(workload: Workload) -> Sequence[Weighted[NodeCandidate]]:
    """The weighted scorers of ``capability-score/v1``."""
    return (
        Weighted(LocalityScorer(workload), LOCALITY_WEIGHT),
        Weighted(QueueDepthScorer(), QUEUE_WEIGHT),
        Weighted(UtilizationScorer(), UTILIZATION_WEIGHT),
    )
