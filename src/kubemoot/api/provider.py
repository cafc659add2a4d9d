"""``ModelProvider``: an inference engine and the capacity it reports."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field

from kubemoot.api.bounds import MAX_ITEMS, ContextTokens, Count, Mib, Parallel, Weight
from kubemoot.api.meta import Condition, Resource, Strict
from kubemoot.settings import DEFAULT_RESERVE_MIB

__all__ = [
    "DEFAULT_PROVIDER_WEIGHT",
    "LoadedModel",
    "ModelProvider",
    "ProviderCapacity",
    "ProviderPolicy",
    "ProviderScheduling",
    "ProviderSpec",
    "ProviderStatus",
]

# The spec's eviction overhead: CUDA context, fragmentation and runtime overhead.
DEFAULT_PROVIDER_WEIGHT = 100


class ProviderScheduling(Strict):
    """``spec.scheduling``: the phase-aware weight (mulling adds it, triage subtracts it)."""

    weight: Weight = DEFAULT_PROVIDER_WEIGHT


class ProviderPolicy(Strict):
    """``spec.policy``: the policy domain of the provider."""

    egress: Literal["none", "allowed"] | None = None


class ProviderSpec(Strict):
    """``ModelProvider.spec``."""

    type: str = "ollama"
    endpoint: str = Field(min_length=1)
    reserve_mib: Mib = Field(default=DEFAULT_RESERVE_MIB, alias="reserveMiB")
    scheduling: ProviderScheduling = Field(default_factory=ProviderScheduling)
    context_length: ContextTokens | None = Field(
        default=None, alias="contextLength", description="OLLAMA_CONTEXT_LENGTH as set."
    )
    num_parallel: Parallel | None = Field(
        default=None, alias="numParallel", description="OLLAMA_NUM_PARALLEL as set."
    )
    policy: ProviderPolicy | None = None
    quarantined_digests: list[str] = Field(
        default_factory=list, max_length=MAX_ITEMS, alias="quarantinedDigests"
    )


class LoadedModel(Strict):
    """One entry of ``status.capacity.loadedModels`` (from Ollama ``/api/ps``)."""

    name: str
    size_mib: Mib | None = Field(default=None, alias="sizeMiB")
    context_length: ContextTokens | None = Field(default=None, alias="contextLength")
    digest: str | None = None


class ProviderCapacity(Strict):
    """``status.capacity``: the source of truth for VRAM and parallelism; None = unknown."""

    vram_total_mib: Mib | None = Field(default=None, alias="vramTotalMiB")
    vram_used_mib: Mib | None = Field(default=None, alias="vramUsedMiB")
    max_parallel: Parallel | None = Field(default=None, alias="maxParallel")
    agent_count: Count | None = Field(default=None, alias="agentCount")
    context_length: ContextTokens | None = Field(default=None, alias="contextLength")
    loaded_models: list[LoadedModel] = Field(
        default_factory=list, max_length=MAX_ITEMS, alias="loadedModels"
    )
    loaded_model_footprints: dict[str, Mib] = Field(
        default_factory=dict,
        alias="loadedModelFootprints",
        description="First observed footprint in MiB per model identifier.",
    )
    digests: list[str] = Field(
        default_factory=list, description="Digests of the model artifacts the provider holds."
    )
    loaded_model_names: str | None = Field(
        default=None, alias="loadedModelNames",
        description="The loaded models' names, comma-separated (for kubectl get).",
    )


class ProviderStatus(Strict):
    """``ModelProvider.status``; ``ready`` None means not known yet."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration",
        description="The metadata.generation this status was computed from.",
    )
    ready: bool | None = None
    last_probed_at: AwareDatetime | None = Field(default=None, alias="lastProbedAt")
    runtime_version: str | None = Field(
        default=None,
        alias="runtimeVersion",
        description="The engine's version as it reports it (Ollama: /api/version).",
    )
    capacity: ProviderCapacity | None = None
    conditions: list[Condition] = Field(default_factory=list)


class ModelProvider(Resource):
    """An inference engine endpoint (Ollama) and its capacity."""

    KIND = "ModelProvider"
    PLURAL = "modelproviders"
    SHORT_NAMES = ("mp",)
    NAMESPACED = False

    kind: Literal["ModelProvider"] = "ModelProvider"
    spec: ProviderSpec
    status: ProviderStatus | None = None

    @property
    def capacity(self) -> ProviderCapacity | None:
        """``status.capacity`` if any."""
        return None if self.status is None else self.status.capacity
