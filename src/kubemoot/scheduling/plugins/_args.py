"""What the framework hands a plugin factory: the context of one decision.

Plugins take only what they need from it; the framework decides which context an
evaluation shares (a pass, a policy's phase, one agent), so a plugin never looks up
anything itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from kubemoot.api import DEFAULT_MAX_AGE_SECONDS, SchedulerSettings, SchedulingRule
from kubemoot.scheduling.candidate import Placement

__all__ = ["PluginArgs", "SpreadContext", "topology_value"]


@dataclass(frozen=True, slots=True)
class SpreadContext:
    """Topology spread as it applies to one phase of one Agent.

    ``used`` holds the topology values the Agent's earlier phases were bound to;
    ``alternatives`` says whether some otherwise-feasible candidate lies elsewhere.
    """

    topology_key: str
    when_unsatisfiable: str
    used: frozenset[str]
    alternatives: bool


def topology_value(placement: Placement, topology_key: str) -> str | None:
    """The candidate's value for the topology key: the provider name, or a provider label."""
    if topology_key == "provider":
        return placement.model.spec.provider_ref
    provider = placement.provider
    return None if provider is None else provider.metadata.labels.get(topology_key)


@dataclass(frozen=True, slots=True)
class PluginArgs:
    """Context for building plugins; every field has the default of "not given"."""

    now: datetime
    phase: str = ""
    rule: SchedulingRule | None = None
    max_age_seconds: int = DEFAULT_MAX_AGE_SECONDS
    settings: SchedulerSettings = field(default_factory=SchedulerSettings)
    bias: float | None = None
    bias_active: bool = False
    assumed: Mapping[str, int] = field(default_factory=dict)
    spread: SpreadContext | None = None
