"""``Agent``: capabilities and discussion role only; the scheduler writes where it runs."""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from kubemoot.api.bounds import Score
from kubemoot.api.meta import Condition, Resource, Strict

__all__ = [
    "CREW_LABEL",
    "Agent",
    "AgentScheduling",
    "AgentSpec",
    "AgentStatus",
    "DecisionSummary",
    "GateFailure",
    "LastUnschedulable",
    "PhaseBinding",
    "PhaseCandidate",
]

# The label that ties an Agent to the CrewSchedulingPolicy whose crewRef equals it.
CREW_LABEL = "kubemoot.ai/crew"


class AgentSpec(BaseModel):
    """``Agent.spec``; fields beyond these belong to the agent runtime and are kept as they are."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False)

    capabilities: list[str] = Field(default_factory=list)
    discuss_role: str | None = Field(default=None, alias="discussRole")
    prompt_refs: list[str] = Field(default_factory=list, alias="promptRefs")
    enabled_tools: list[str] = Field(default_factory=list, alias="enabledTools")
    deployment_ref: str | None = Field(
        default=None, alias="deploymentRef", description="Deployment whose env the binding patches."
    )

    @model_validator(mode="after")
    def _no_misspelt_field(self) -> AgentSpec:
        # Extra fields are the agent runtime's, so an unknown key is no error by itself;
        # but one a letter or two from a field of ours is a typo that would otherwise
        # schedule the Agent with, say, no capabilities at all, and say nothing.
        if not self.model_extra:
            return self
        ours = [str(f.alias or name) for name, f in type(self).model_fields.items()]
        for key in self.model_extra:
            close = difflib.get_close_matches(key, ours, n=1, cutoff=0.8)
            if close and key not in ours:
                raise ValueError(f'unknown field "{key}"; did you mean "{close[0]}"?')
        return self


class PhaseCandidate(Strict):
    """One entry of a phase's ranked candidate list (model identifier and quality score)."""

    model: str
    score: Score


#: Bounds of a decision summary: a status stays small however large the fleet.
SUMMARY_FAILURES = 3
SUMMARY_TRIGGERS = 8
SUMMARY_TEXT = 240


class GateFailure(Strict):
    """One gate that put candidates out, with how many and one of its reasons."""

    gate: str
    count: int = Field(ge=0)
    reason: str = Field(max_length=SUMMARY_TEXT)


class DecisionSummary(Strict):
    """The bounded part of a phase's decision record kept in ``status`` (DESIGN §4)."""

    feasible: int = Field(ge=0, description="Candidates every gate passed.")
    uncertain: int = Field(ge=0, description="Candidates left on UNKNOWN or STALE evidence.")
    failed: int = Field(ge=0, description="Candidates a gate FAILed.")
    top_failures: list[GateFailure] = Field(
        default_factory=list, alias="topFailures", max_length=SUMMARY_FAILURES,
        description="The gates that failed most candidates, most first.",
    )
    scheduler_version: str = Field(alias="schedulerVersion")
    scoring_policy_version: str = Field(alias="scoringPolicyVersion")
    policy_version: str | None = Field(
        default=None, alias="policyVersion",
        description="Digest of the CrewSchedulingPolicy spec decided with (none: no policy).",
    )
    recheck_triggers: list[str] = Field(
        default_factory=list, alias="recheckTriggers", max_length=SUMMARY_TRIGGERS,
        description="What would change this decision.",
    )


class PhaseBinding(BaseModel):
    """The binding of one phase; the scheduler may record more detail than these fields."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False)

    model: str | None = Field(default=None, description="Name of the bound Model.")
    model_id: str | None = Field(default=None, alias="modelId", description="Its identifier.")
    provider: str | None = None
    endpoint: str | None = None
    score: Score | None = None
    outcome: Literal["PLACE", "UNSCHEDULABLE", "DEFER"] | None = None
    reason: str | None = None
    candidates: list[PhaseCandidate] = Field(default_factory=list)
    decision: DecisionSummary | None = None


class LastUnschedulable(Strict):
    """The most recent FailedScheduling result for the Agent."""

    phase: str
    reason: str
    observed_at: AwareDatetime | None = Field(default=None, alias="observedAt")
    crew_scheduling_policy: str | None = Field(default=None, alias="crewSchedulingPolicy")


class AgentScheduling(Strict):
    """``status.scheduling``: the preferred binding and the per-phase detail."""

    model: str | None = None
    model_id: str | None = Field(default=None, alias="modelId")
    provider: str | None = None
    endpoint: str | None = None
    phases: dict[str, PhaseBinding] = Field(default_factory=dict)
    last_unschedulable: LastUnschedulable | None = Field(default=None, alias="lastUnschedulable")


class AgentStatus(Strict):
    """``Agent.status``."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration",
        description="The metadata.generation this status was computed from.",
    )
    ready: bool | None = None
    scheduling: AgentScheduling | None = None
    conditions: list[Condition] = Field(default_factory=list)


class Agent(Resource):
    """A crew member: it declares what it can do, never which model or GPU it uses."""

    KIND = "Agent"
    PLURAL = "agents"
    SHORT_NAMES = ("agt",)
    NAMESPACED = True

    kind: Literal["Agent"] = "Agent"
    spec: AgentSpec = Field(default_factory=AgentSpec)
    status: AgentStatus | None = None

    @property
    def crew(self) -> str | None:
        """The ``kubemoot.ai/crew`` label, if set."""
        return self.metadata.labels.get(CREW_LABEL)

    def spec_extras(self) -> dict[str, Any]:
        """Spec fields this package does not model (kept for the agent runtime)."""
        return dict(self.spec.model_extra or {})
