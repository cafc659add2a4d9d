"""``Model``: what a model is (labels), what it needs (``vramMib``) and where it lives."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from kubemoot.api.bounds import Mib
from kubemoot.api.meta import Condition, Resource, Strict
from kubemoot.api.runtime import parse_runtime

__all__ = ["License", "Model", "ModelSpec", "ModelStatus"]

License = Literal["ALLOW", "REVIEW_REQUIRED", "BLOCKED"]
Egress = Literal["none", "allowed"]


class ModelSpec(Strict):
    """``Model.spec``; capability-aware fields (digest, license, runtime, egress) are optional."""

    model: str = Field(
        min_length=1, description="The model identifier on the provider, e.g. qwen3:32b."
    )
    provider_ref: str = Field(
        min_length=1, alias="providerRef", description="The ModelProvider this Model lives on."
    )
    vram_mib: Mib | None = Field(
        default=None,
        alias="vramMib",
        description="Declared footprint in MiB, used until the model has been observed loaded.",
    )
    pinned: bool | None = Field(
        default=None,
        description="Keep this model loaded on its provider: loaded at start, loaded "
        "again whenever it is not resident, never unloaded to make room for another.",
    )
    digest: str | None = Field(default=None, description="Artifact digest (the Ollama manifest).")
    license: License | None = None
    runtime: str | None = Field(default=None, description="Runtime requirement, e.g. ollama>=0.6.")
    egress: Egress | None = None

    @field_validator("runtime")
    @classmethod
    def _runtime_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_runtime(value)  # a ValueError names what is wrong with it
        return value


class ModelStatus(Strict):
    """``Model.status``; a Model without status is taken as Ready."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration",
        description="The metadata.generation this status was computed from.",
    )
    ready: bool | None = None
    footprint_mib: Mib | None = Field(
        default=None, alias="footprintMiB", description="Observed footprint in MiB."
    )
    conditions: list[Condition] = Field(default_factory=list)


class Model(Resource):
    """A model on a provider, described by labels (family, params, capability/…)."""

    KIND = "Model"
    PLURAL = "models"
    SHORT_NAMES = ("mdl",)
    NAMESPACED = False

    kind: Literal["Model"] = "Model"
    spec: ModelSpec
    status: ModelStatus | None = None

    @property
    def is_ready(self) -> bool:
        """Ready unless the status says otherwise (hand-written bundles carry no status)."""
        return self.status is None or self.status.ready is not False
