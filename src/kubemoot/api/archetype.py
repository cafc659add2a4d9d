"""``MootArchetype``: a coordination model and the phase names policies may use."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator

from kubemoot.api.meta import Condition, Resource, Strict

__all__ = ["ArchetypePhase", "ArchetypeSpec", "ArchetypeStatus", "MootArchetype", "Phase"]


class Phase(StrEnum):
    """The built-in consent-3 discussion's steps, in order.

    Triage and mulling bind a model per agent; an archetype may name other phases.
    """

    SELECTION = "selection"
    TRIAGE = "triage"
    MULLING = "mulling"
    CONSENT = "consent"
    SYNTHESIS = "synthesis"


class ArchetypePhase(Strict):
    """One scheduling phase (e.g. ``mulling``, ``triage``)."""

    name: str = Field(min_length=1)
    description: str | None = None


class ArchetypeSpec(Strict):
    """``MootArchetype.spec``: the phase vocabulary and the roles of the discussion."""

    description: str | None = None
    phases: list[ArchetypePhase] = Field(min_length=1)
    roles: list[str] = Field(
        default_factory=list, description="Discussion roles an Agent's discussRole may take."
    )

    @field_validator("phases")
    @classmethod
    def _unique_phase_names(cls, phases: list[ArchetypePhase]) -> list[ArchetypePhase]:
        seen: set[str] = set()
        for phase in phases:
            if phase.name in seen:
                raise ValueError(f'phase "{phase.name}" is declared more than once')
            seen.add(phase.name)
        return phases


class ArchetypeStatus(Strict):
    """``MootArchetype.status``."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration",
        description="The metadata.generation this status was computed from.",
    )
    phase_names: str | None = Field(
        default=None, alias="phaseNames",
        description="The phase names, comma-separated (for kubectl get).",
    )
    conditions: list[Condition] = Field(default_factory=list)


class MootArchetype(Resource):
    """Cluster-scoped: the phases a CrewSchedulingPolicy's rules may name."""

    KIND = "MootArchetype"
    PLURAL = "mootarchetypes"
    SHORT_NAMES = ("archetype",)
    NAMESPACED = False

    kind: Literal["MootArchetype"] = "MootArchetype"
    spec: ArchetypeSpec
    status: ArchetypeStatus | None = None

    @property
    def phase_names(self) -> list[str]:
        """The declared phase names, in order."""
        return [phase.name for phase in self.spec.phases]
