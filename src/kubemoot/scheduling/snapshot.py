"""A read-only view of the cluster for one scheduling pass, and policy resolution.

Built once from a bundle (or the operator's cache); every lookup the scheduler needs is
an index here, so the scheduling code itself never searches lists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain

from kubemoot.api import (
    Agent,
    CrewSchedulingPolicy,
    KubemootConfig,
    Model,
    ModelProvider,
    MootArchetype,
    SchedulerSettings,
)
from kubemoot.api.loader import Bundle
from kubemoot.scheduling.archetypes import CONSENT_3, DEFAULT_ARCHETYPE, builtin_archetypes
from kubemoot.scheduling.candidate import Placement, fleet_footprints
from kubemoot.scheduling.roster import AgentRoster

__all__ = ["ClusterSnapshot", "PolicyResolution"]


@dataclass(frozen=True, slots=True)
class PolicyResolution:
    """Which policy governs an Agent; ``note`` explains a missing or ambiguous one."""

    policy: CrewSchedulingPolicy | None
    note: str | None = None
    #: The PolicyResolved reason: PolicyMatched, AmbiguousCrewRef, NoMatchingPolicy,
    #: AmbiguousPolicy or NoPolicy (the namespace has none).
    reason: str = "PolicyMatched"


@dataclass(frozen=True)
class ClusterSnapshot:
    """Models, providers, agents, policies and archetypes, indexed for the scheduler."""

    models: tuple[Model, ...]
    providers: dict[str, ModelProvider]
    agents: tuple[Agent, ...] = ()
    policies: tuple[CrewSchedulingPolicy, ...] = ()
    archetypes: dict[str, MootArchetype] = field(default_factory=builtin_archetypes)
    settings: SchedulerSettings = field(default_factory=SchedulerSettings)
    #: The Agents filed for a pass (:mod:`kubemoot.scheduling.roster`): one kept between
    #: snapshots by whoever keeps the Agents, else made from ``agents`` when first read.
    agent_roster: AgentRoster | None = field(default=None, repr=False, compare=False)
    placements: tuple[Placement, ...] = field(init=False)
    _by_namespace: dict[str, list[CrewSchedulingPolicy]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ordered = sorted(self.models, key=lambda model: model.metadata.name)
        # Once per snapshot, not per candidate: a footprint seen on one provider sizes
        # the same identifier on every other (DESIGN §4).
        sightings = fleet_footprints(self.providers.values(), ordered)
        placements = tuple(
            Placement(
                model,
                self.providers.get(model.spec.provider_ref),
                sightings.get(model.spec.model),
            )
            for model in ordered
        )
        by_namespace: dict[str, list[CrewSchedulingPolicy]] = {}
        for policy in sorted(self.policies, key=lambda p: p.metadata.name):
            by_namespace.setdefault(policy.namespace or "default", []).append(policy)
        if self.agent_roster is not None and not self.agents:
            segments = self.agent_roster.segments()
            object.__setattr__(
                self, "agents", tuple(chain.from_iterable(s.agents for s in segments))
            )
        object.__setattr__(self, "placements", placements)
        object.__setattr__(self, "_by_namespace", by_namespace)

    @property
    def roster(self) -> AgentRoster:
        """The snapshot's Agents filed for a pass; made once when not given.

        Made for this snapshot's policies: it does not read the capabilities of Agents
        whose policy has no qualityBias, as they cannot change their bindings here.
        """
        if self.agent_roster is None:
            roster = AgentRoster(self.agents, capabilities_matter=self.capabilities_matter)
            object.__setattr__(self, "agent_roster", roster)
        assert self.agent_roster is not None
        return self.agent_roster

    def capabilities_matter(self, namespace: str, crew: str | None) -> bool:
        """Whether an Agent's capabilities can change its bindings in this snapshot: only
        its effective bias reads them, and only a policy with a qualityBias has one."""
        policy = self.resolve(namespace, crew).policy
        return policy is not None and bool(policy.spec.quality_bias)

    @classmethod
    def build(
        cls,
        *,
        models: Iterable[Model] = (),
        providers: Iterable[ModelProvider] = (),
        agents: Iterable[Agent] = (),
        policies: Iterable[CrewSchedulingPolicy] = (),
        archetypes: Iterable[MootArchetype] = (),
        config: KubemootConfig | None = None,
        roster: AgentRoster | None = None,
    ) -> ClusterSnapshot:
        """A snapshot from resources; bundle archetypes override the built-in ones.

        ``roster``: the Agents, already filed (kept up to date between snapshots); then
        ``agents`` may be left out, and if given must be the roster's Agents.
        """
        known = builtin_archetypes()
        known.update({archetype.metadata.name: archetype for archetype in archetypes})
        return cls(
            models=tuple(models),
            providers={provider.metadata.name: provider for provider in providers},
            agents=tuple(agents),
            policies=tuple(policies),
            archetypes=known,
            settings=(config or KubemootConfig.defaults()).spec.scheduler,
            agent_roster=roster,
        )

    @classmethod
    def from_bundle(
        cls, bundle: Bundle, *, config: KubemootConfig | None = None,
        roster: AgentRoster | None = None,
    ) -> ClusterSnapshot:
        """A snapshot of a loaded bundle; ``config`` overrides the bundle's KubemootConfig;
        ``roster``: the bundle's Agents filed beforehand (see :meth:`build`)."""
        return cls.build(
            models=bundle.models,
            providers=bundle.providers,
            agents=bundle.agents,
            policies=bundle.policies,
            archetypes=bundle.archetypes,
            config=config or bundle.config,
            roster=roster,
        )

    def policies_in(self, namespace: str) -> list[CrewSchedulingPolicy]:
        """The policies of one namespace, by name."""
        return self._by_namespace.get(namespace, [])

    def resolve_policy(self, agent: Agent) -> PolicyResolution:
        """DESIGN §3: the crew label picks the policy with that crewRef in the namespace;
        without the label the namespace's only policy applies; otherwise none does."""
        return self.resolve(agent.namespace or "default", agent.crew)

    def resolve(self, namespace: str, crew: str | None) -> PolicyResolution:
        """:meth:`resolve_policy` for an Agent of this namespace and crew label."""
        policies = self.policies_in(namespace)
        if crew is not None:
            matching = [p for p in policies if p.spec.crew_ref == crew]
            if len(matching) == 1:
                return PolicyResolution(matching[0])
            if matching:
                names = ", ".join(p.metadata.name for p in matching)
                return PolicyResolution(
                    matching[0],
                    f'several policies have crewRef "{crew}" ({names}); using '
                    f"{matching[0].metadata.name}",
                    "AmbiguousCrewRef",
                )
            return PolicyResolution(
                None,
                f'no CrewSchedulingPolicy in namespace {namespace} has crewRef "{crew}"; '
                "every Ready Model is a candidate with quality 0",
                "NoMatchingPolicy",
            )
        if len(policies) == 1:
            return PolicyResolution(policies[0])
        if policies:
            return PolicyResolution(
                None,
                f"{len(policies)} policies in namespace {namespace} and the Agent has no "
                "kubemoot.ai/crew label; every Ready Model is a candidate with quality 0",
                "AmbiguousPolicy",
            )
        return PolicyResolution(
            None,
            f"namespace {namespace} has no CrewSchedulingPolicy; every Ready Model is a "
            "candidate with quality 0",
            "NoPolicy",
        )

    def archetype_for(
        self, policy: CrewSchedulingPolicy | None
    ) -> tuple[MootArchetype, str | None]:
        """The policy's archetype (consent-3 when unnamed) and a problem if it is unknown."""
        ref = None if policy is None else policy.spec.archetype_ref
        if ref is None:
            return self.archetypes.get(DEFAULT_ARCHETYPE, CONSENT_3), None
        found = self.archetypes.get(ref)
        if found is not None:
            return found, None
        return CONSENT_3, f'MootArchetype "{ref}" does not exist; using {DEFAULT_ARCHETYPE}'
