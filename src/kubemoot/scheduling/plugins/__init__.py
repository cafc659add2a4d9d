"""The scheduling plugins and the registry that names them.

One module per gate or scorer, each a class with a ``name`` and one method (``check``
or ``score``) plus a ``from_args`` factory. The registry below is the only place that
lists them; the framework (:mod:`kubemoot.scheduling.framework`) decides their order,
weights and which context each shares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kubemoot.gates import Gate, Scorer, Verdict
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs, SpreadContext, topology_value
from kubemoot.scheduling.plugins.capacity import CapacityScorer
from kubemoot.scheduling.plugins.digest import DigestGate
from kubemoot.scheduling.plugins.egress import EgressGate
from kubemoot.scheduling.plugins.freshness import FreshnessGate
from kubemoot.scheduling.plugins.image_locality import ImageLocalityScorer
from kubemoot.scheduling.plugins.license import LicenseGate
from kubemoot.scheduling.plugins.model_ready import ModelReadyGate
from kubemoot.scheduling.plugins.parallelism import ParallelismGate, agent_limit
from kubemoot.scheduling.plugins.provider_ready import ProviderReadyGate
from kubemoot.scheduling.plugins.provider_weight import PHASE_SIGN, ProviderWeightScorer
from kubemoot.scheduling.plugins.quality import QualityScorer, quality_score
from kubemoot.scheduling.plugins.require import RequireGate
from kubemoot.scheduling.plugins.runtime import RuntimeGate
from kubemoot.scheduling.plugins.topology_spread import TopologySpreadGate
from kubemoot.scheduling.plugins.vram import VramGate

__all__ = [
    "GATES",
    "JUDGED",
    "PHASE_SIGN",
    "SCORERS",
    "CapacityScorer",
    "DigestGate",
    "EgressGate",
    "FreshnessGate",
    "GateFactory",
    "ImageLocalityScorer",
    "JudgedFactory",
    "JudgedGate",
    "LicenseGate",
    "ModelReadyGate",
    "ParallelismGate",
    "PluginArgs",
    "ProviderReadyGate",
    "ProviderWeightScorer",
    "QualityScorer",
    "RequireGate",
    "RuntimeGate",
    "ScorerFactory",
    "SpreadContext",
    "TopologySpreadGate",
    "VramGate",
    "agent_limit",
    "quality_score",
    "topology_value",
]



class JudgedGate(Gate[Placement], Protocol):
    """A gate that can also give its verdict alone.

    ``judge(c)`` is ``check(c).result``, without the reason and evidence: a pass uses it
    for the gates it evaluates for every Model and builds a result only when a decision
    record or a message reads it. These gates never admit an UNKNOWN.
    """

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict :meth:`check` would give."""
        ...


GateFactory = Callable[[PluginArgs], Gate[Placement]]
JudgedFactory = Callable[[PluginArgs], JudgedGate]
ScorerFactory = Callable[[PluginArgs], Scorer[Placement]]

# The gates between Require and TopologySpread, in the order the framework runs them:
# each also judges without explaining (:class:`JudgedGate`).
_JUDGED = (ModelReadyGate, ProviderReadyGate, FreshnessGate, VramGate, ParallelismGate,
           LicenseGate, EgressGate, RuntimeGate, DigestGate)

#: Every gate by name, in the order the framework runs them (cheap and common first,
#: so the FailedScheduling message counts the most telling reason).
GATES: dict[str, GateFactory] = {
    RequireGate.name: RequireGate.from_args,
    **{gate.name: gate.from_args for gate in _JUDGED},
    TopologySpreadGate.name: TopologySpreadGate.from_args,
}

#: The gates that can judge without explaining (:class:`JudgedGate`): every gate whose
#: verdict depends on the Model and its provider (and, for Parallelism, the bindings
#: assumed), in :data:`GATES` order.
JUDGED: dict[str, JudgedFactory] = {gate.name: gate.from_args for gate in _JUDGED}

#: Every scorer by name. Weights are the framework's business, not the scorers'.
SCORERS: dict[str, ScorerFactory] = {
    QualityScorer.name: QualityScorer.from_args,
    CapacityScorer.name: CapacityScorer.from_args,
    ImageLocalityScorer.name: ImageLocalityScorer.from_args,
    ProviderWeightScorer.name: ProviderWeightScorer.from_args,
}
