"""Capability-aware placement: typed hard gates over declared node evidence.

Takes a ``PlacementRequest`` (a workload contract, nodes with capability evidence and
``observedAt``, a freshness policy and ``now``) and decides PLACE, UNSCHEDULABLE or
DEFER with a decision record, using the one engine in :mod:`kubemoot.gates`.

Pure: it reads no files and no clock (the CLI passes text and time in) and imports
only :mod:`kubemoot.gates` and :class:`kubemoot.api.errors.InputError` of ours.
"""

from __future__ import annotations

from kubemoot.capability.decision import (
    DECISION_KIND,
    SCHEDULER_VERSION,
    decide,
    decision_document,
)
from kubemoot.capability.gates import GATE_FIELDS, NodeCandidate, capability_gates
from kubemoot.capability.model import (
    DEFAULT_MAX_AGE_SECONDS,
    NodeEvidence,
    PlacementRequest,
    Workload,
    load_request,
    parse_request,
)
from kubemoot.capability.scoring import SCORING_POLICY_VERSION, scoring_policy

__all__ = [
    "DECISION_KIND",
    "DEFAULT_MAX_AGE_SECONDS",
    "GATE_FIELDS",
    "SCHEDULER_VERSION",
    "SCORING_POLICY_VERSION",
    "NodeCandidate",
    "NodeEvidence",
    "PlacementRequest",
    "Workload",
    "capability_gates",
    "decide",
    "decision_document",
    "load_request",
    "parse_request",
    "scoring_policy",
]
