"""``CrewSchedulingPolicy``: require/prefer rules per discussion phase, the affinity idiom."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from kubemoot.api.bounds import MAX_ITEMS, MAX_SECONDS
from kubemoot.api.meta import Condition, Resource, Strict
from kubemoot.api.selectors import LabelSelector

__all__ = [
    "DEFAULT_MAX_AGE_SECONDS",
    "CrewSchedulingPolicy",
    "Freshness",
    "PolicySpec",
    "PolicyStatus",
    "PreferTerm",
    "SchedulingRule",
    "TopologySpread",
]

DEFAULT_MAX_AGE_SECONDS = 120


class PreferTerm(Strict):
    """A soft preference: ``weight`` (1–100, as in Kubernetes) added when ``selector`` matches."""

    weight: int = Field(ge=1, le=100)
    selector: LabelSelector


class SchedulingRule(Strict):
    """The rule for one phase: ``require`` is hard, ``prefer`` is soft."""

    phase: str = Field(min_length=1)
    require: LabelSelector | None = None
    prefer: list[PreferTerm] = Field(default_factory=list, max_length=MAX_ITEMS)

    @field_validator("prefer", mode="before")
    @classmethod
    def _prefer_default(cls, prefer: Any) -> Any:
        return [] if prefer is None else prefer

    def admits(self, labels: Mapping[str, str]) -> bool:
        """Whether a Model with ``labels`` passes ``require``.

        A rule that states no ``require`` at all requires nothing; this differs from a null
        selector *value* (which matches nothing) because the user wrote no requirement.
        """
        return self.require is None or self.require.matches(labels)


class TopologySpread(Strict):
    """Spread the phases of one Agent over distinct values of ``topologyKey``."""

    when_unsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = Field(
        default="ScheduleAnyway", alias="whenUnsatisfiable"
    )
    topology_key: str = Field(default="provider", min_length=1, alias="topologyKey")
    phase_keys: list[str] = Field(default_factory=list, alias="phaseKeys")


class Freshness(Strict):
    """How old a provider's probed status may be before its capacity gates turn STALE."""

    max_age_seconds: int = Field(
        default=DEFAULT_MAX_AGE_SECONDS, ge=1, le=int(MAX_SECONDS), alias="maxAgeSeconds"
    )


class PolicySpec(Strict):
    """``CrewSchedulingPolicy.spec``."""

    crew_ref: str | None = Field(default=None, alias="crewRef")
    archetype_ref: str | None = Field(default=None, alias="archetypeRef")
    quality_bias: dict[str, str] = Field(
        default_factory=dict,
        alias="qualityBias",
        description="Capability → bias in [0.0, 1.0] as a string; unparsable values are ignored.",
    )
    rules: list[SchedulingRule] = Field(default_factory=list, max_length=MAX_ITEMS)
    topology_spread: TopologySpread | None = Field(default=None, alias="topologySpread")
    freshness: Freshness = Field(default_factory=Freshness)

    @field_validator("quality_bias", mode="before")
    @classmethod
    def _bias_numbers_as_text(cls, bias: Any) -> Any:
        # Unquoted YAML numbers (0.7) mean what the quoted form means; keep them as text so
        # the scheduler applies one parsing rule to every value.
        if isinstance(bias, Mapping):
            return {
                key: str(value)
                if isinstance(value, int | float) and not isinstance(value, bool)
                else value
                for key, value in bias.items()
            }
        return {} if bias is None else bias

    @field_validator("rules", mode="before")
    @classmethod
    def _rules_default(cls, rules: Any) -> Any:
        return [] if rules is None else rules

    def rule_for(self, phase: str) -> SchedulingRule | None:
        """The first rule for ``phase``, if any."""
        return next((rule for rule in self.rules if rule.phase == phase), None)


class PolicyStatus(Strict):
    """``CrewSchedulingPolicy.status``."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration",
        description="The metadata.generation this status was computed from.",
    )
    conditions: list[Condition] = Field(default_factory=list)


class CrewSchedulingPolicy(Resource):
    """How a crew's Agents are matched to Models, phase by phase."""

    KIND = "CrewSchedulingPolicy"
    PLURAL = "crewschedulingpolicies"
    SHORT_NAMES = ("csp",)
    NAMESPACED = True

    kind: Literal["CrewSchedulingPolicy"] = "CrewSchedulingPolicy"
    spec: PolicySpec = Field(default_factory=PolicySpec)
    status: PolicyStatus | None = None
