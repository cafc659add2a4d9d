"""``ModelClass``: a virtual model name that stands for a ranked set of Models.

A client asks for the class's name as if it were a model; its candidates are the Ready
Models its ``require`` selector admits, ranked like a policy rule's candidates: by the
``prefer`` weights, or (without a prefer block) by the ``qualityBias`` term over each
Model's ``latencyClass`` label. Each call may use any candidate within ``tolerance``
points of the preferred one, as the per-call runtime decides.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator

from kubemoot.api.meta import Condition, Resource, Strict
from kubemoot.api.policy import PreferTerm
from kubemoot.api.selectors import LabelSelector

__all__ = ["ModelClass", "ModelClassSpec", "ModelClassStatus"]


class ModelClassSpec(Strict):
    """``ModelClass.spec``; every field is optional (an empty spec admits every Model)."""

    require: LabelSelector | None = Field(
        default=None, description="Hard: only Models whose labels match are candidates."
    )
    prefer: list[PreferTerm] = Field(
        default_factory=list,
        description="Soft: each matching term adds its weight to a Model's score.",
    )
    quality_bias: str | None = Field(
        default=None,
        alias="qualityBias",
        description="Speed (0) versus quality (1), as a string in [0, 1]; used when "
        "there is no prefer block, as a CrewSchedulingPolicy's qualityBias is.",
    )
    tolerance: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Points below the preferred candidate's score a call may still "
        "use; unset means the runtime's candidate tolerance.",
    )

    @field_validator("prefer", mode="before")
    @classmethod
    def _prefer_default(cls, prefer: Any) -> Any:
        return [] if prefer is None else prefer

    @field_validator("quality_bias", mode="before")
    @classmethod
    def _bias_in_range(cls, bias: Any) -> Any:
        # An unquoted YAML number (0.7) means what the quoted form means.
        if isinstance(bias, int | float) and not isinstance(bias, bool):
            bias = str(bias)
        if isinstance(bias, str):
            try:
                value = float(bias.strip())
            except ValueError:
                value = math.nan
            if not 0.0 <= value <= 1.0:  # NaN fails this too
                raise ValueError(f'must be a number in [0, 1] (e.g. "0.7"), got {bias!r}')
        return bias


class ModelClassStatus(Strict):
    """``ModelClass.status``."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration",
        description="The metadata.generation this status was computed from.",
    )
    conditions: list[Condition] = Field(default_factory=list)


class ModelClass(Resource):
    """Cluster-scoped: a name clients may use in place of a model identifier."""

    KIND = "ModelClass"
    PLURAL = "modelclasses"
    SHORT_NAMES = ("mc",)
    NAMESPACED = False

    kind: Literal["ModelClass"] = "ModelClass"
    spec: ModelClassSpec = Field(default_factory=ModelClassSpec)
    status: ModelClassStatus | None = None
