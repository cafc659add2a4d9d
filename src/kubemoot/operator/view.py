"""The operator's view of the cluster (from kopf indexes) and who a change affects.

kopf keeps one in-memory index per kind, filled from the watch streams before any
handler runs; :class:`ClusterView` reads them as parsed resources. The ``affected_*``
functions answer the state-driven question of DESIGN §3 and the spec's third design
principle: when one object changes, *which* Agents must be scheduled again. They are
pure and err on the side of including an Agent whose result could change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubemoot.api import (
    Agent,
    CrewSchedulingPolicy,
    KubemootConfig,
    Model,
    ModelProvider,
    MootArchetype,
)
from kubemoot.scheduling.archetypes import DEFAULT_ARCHETYPE
from kubemoot.scheduling.snapshot import ClusterSnapshot

__all__ = [
    "INDEX_IDS",
    "ClusterView",
    "affected_by_archetype",
    "affected_by_models",
    "affected_by_policies",
    "affected_by_provider",
    "agent_key",
    "bound_providers",
    "deferred",
    "waiting",
]

#: The kopf index id of each kind (also the handler kwarg that carries it).
INDEX_IDS = {
    "Model": "kubemoot_models",
    "ModelProvider": "kubemoot_providers",
    "Agent": "kubemoot_agents",
    "CrewSchedulingPolicy": "kubemoot_policies",
    "MootArchetype": "kubemoot_archetypes",
    "KubemootConfig": "kubemoot_configs",
}


def agent_key(agent: Agent) -> str:
    """``namespace/name``, the operator's handle on an Agent."""
    return f"{agent.namespace}/{agent.metadata.name}"


def _values(index: Any) -> Iterable[Any]:
    # A kopf Index maps a key to a Store of values; our keys are unique object keys.
    if index is None:
        return ()
    return [value for store in index.values() for value in store]


@dataclass
class ClusterView:
    """Parsed resources by name (agents and policies by ``namespace/name``)."""

    models: dict[str, Model] = field(default_factory=dict)
    providers: dict[str, ModelProvider] = field(default_factory=dict)
    agents: dict[str, Agent] = field(default_factory=dict)
    policies: dict[str, CrewSchedulingPolicy] = field(default_factory=dict)
    archetypes: dict[str, MootArchetype] = field(default_factory=dict)
    configs: list[KubemootConfig] = field(default_factory=list)

    @classmethod
    def from_indexes(cls, indexes: Mapping[str, Any]) -> ClusterView:
        """Read the kopf indexes named in :data:`INDEX_IDS`."""
        view = cls()
        for model in _values(indexes.get(INDEX_IDS["Model"])):
            view.models[model.metadata.name] = model
        for provider in _values(indexes.get(INDEX_IDS["ModelProvider"])):
            view.providers[provider.metadata.name] = provider
        for agent in _values(indexes.get(INDEX_IDS["Agent"])):
            view.agents[agent_key(agent)] = agent
        for policy in _values(indexes.get(INDEX_IDS["CrewSchedulingPolicy"])):
            view.policies[f"{policy.namespace}/{policy.metadata.name}"] = policy
        for archetype in _values(indexes.get(INDEX_IDS["MootArchetype"])):
            view.archetypes[archetype.metadata.name] = archetype
        view.configs = sorted(
            _values(indexes.get(INDEX_IDS["KubemootConfig"])), key=lambda c: c.metadata.name
        )
        return view

    def agent_counts(
        self,
        *,
        exclude: Iterable[str] = (),
        assumed: Mapping[str, frozenset[str]] | None = None,
    ) -> dict[str, int]:
        """Agents bound (in any phase) per provider, leaving out ``exclude``.

        The operator keeps ``agentCount`` itself (DESIGN §4): an Agent being scheduled
        again must not count against itself, so the batch being scheduled is left out
        and counted by the scheduling pass as it binds. ``assumed`` holds the bindings
        the operator wrote itself and may not have seen come back through the watch
        yet (kube-scheduler's assumed pods); they win over the Agent's status here.
        """
        skip = set(exclude)
        known = assumed or {}
        counts: dict[str, int] = {}
        for key, agent in self.agents.items():
            if key in skip:
                continue
            providers = known[key] if key in known else bound_providers(agent)
            for provider in providers:
                counts[provider] = counts.get(provider, 0) + 1
        return counts

    def snapshot(
        self,
        *,
        exclude: Iterable[str] = (),
        assumed: Mapping[str, frozenset[str]] | None = None,
    ) -> ClusterSnapshot:
        """A scheduling snapshot whose providers carry the operator's agent counts."""
        counts = self.agent_counts(exclude=exclude, assumed=assumed)
        providers = []
        for name, provider in self.providers.items():
            capacity = provider.capacity
            if capacity is not None:
                capacity = capacity.model_copy(update={"agent_count": counts.get(name, 0)})
                status = provider.status.model_copy(update={"capacity": capacity})  # type: ignore[union-attr]
                provider = provider.model_copy(update={"status": status})
            providers.append(provider)
        return ClusterSnapshot.build(
            models=self.models.values(),
            providers=providers,
            agents=self.agents.values(),
            policies=self.policies.values(),
            archetypes=self.archetypes.values(),
            config=self.configs[0] if self.configs else None,
        )


def bound_providers(agent: Agent) -> set[str]:
    """Providers the Agent's status binds any phase to."""
    scheduling = None if agent.status is None else agent.status.scheduling
    if scheduling is None:
        return set()
    return {phase.provider for phase in scheduling.phases.values() if phase.provider}


def waiting(agent: Agent) -> bool:
    """Whether some phase of the Agent is not bound (deferred, unschedulable, never run)."""
    scheduling = None if agent.status is None else agent.status.scheduling
    if scheduling is None or not scheduling.phases:
        return True
    return any(phase.outcome != "PLACE" for phase in scheduling.phases.values())


def deferred(agent: Agent) -> bool:
    """Whether some phase of the Agent waits on missing or stale evidence (DEFER)."""
    scheduling = None if agent.status is None else agent.status.scheduling
    if scheduling is None:
        return False
    return any(phase.outcome == "DEFER" for phase in scheduling.phases.values())


def _mentions(agent: Agent, model: Model) -> bool:
    scheduling = None if agent.status is None else agent.status.scheduling
    if scheduling is None:
        return False
    for phase in scheduling.phases.values():
        if phase.model == model.metadata.name:
            return True
        if any(candidate.model == model.spec.model for candidate in phase.candidates):
            return True
    return False


def _admits(snapshot: ClusterSnapshot, agent: Agent, labels: Mapping[str, str]) -> bool:
    """Whether a Model with ``labels`` could be a candidate for any phase of the Agent."""
    policy = snapshot.resolve_policy(agent).policy
    if policy is None:
        return True  # no policy: every Ready Model is a candidate
    archetype, _ = snapshot.archetype_for(policy)
    for phase in archetype.phase_names:
        rule = policy.spec.rule_for(phase)
        if rule is None or rule.admits(labels):
            return True
    return False


def affected_by_models(snapshot: ClusterSnapshot, models: Iterable[Model]) -> set[str]:
    """Agents for which one of ``models`` (old or new versions) is or was a candidate."""
    found: set[str] = set()
    items = list(models)
    for agent in snapshot.agents:
        for model in items:
            if _mentions(agent, model) or _admits(snapshot, agent, model.labels):
                found.add(agent_key(agent))
                break
    return found


def affected_by_provider(
    snapshot: ClusterSnapshot, provider: str, models: Iterable[Model]
) -> set[str]:
    """Agents that a change of ``provider`` (capacity, readiness, spec) may move.

    Those with a candidate Model on it, and those bound to it now.
    """
    found = affected_by_models(
        snapshot, [m for m in models if m.spec.provider_ref == provider]
    )
    for agent in snapshot.agents:
        if provider in bound_providers(agent):
            found.add(agent_key(agent))
    return found


def affected_by_policies(
    snapshot: ClusterSnapshot, policies: Iterable[CrewSchedulingPolicy]
) -> set[str]:
    """Agents a policy (old or new version) governs or could govern.

    In the policy's namespace: those whose crew label equals its crewRef, and those
    without a crew label (they take the namespace's only policy, so a policy appearing or
    going away changes them).
    """
    found: set[str] = set()
    for policy in policies:
        for agent in snapshot.agents:
            if agent.namespace != policy.namespace:
                continue
            if agent.crew is None or agent.crew == policy.spec.crew_ref:
                found.add(agent_key(agent))
    return found


def affected_by_archetype(snapshot: ClusterSnapshot, name: str) -> set[str]:
    """Agents whose policy names the archetype (consent-3 also serves the unnamed)."""
    found: set[str] = set()
    for agent in snapshot.agents:
        policy = snapshot.resolve_policy(agent).policy
        ref = None if policy is None else policy.spec.archetype_ref
        if ref == name or (ref is None and name == DEFAULT_ARCHETYPE):
            found.add(agent_key(agent))
    return found
