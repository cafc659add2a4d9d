"""The unit the operator-side scheduler judges: a Model on the provider it names.

Also the few facts about a provider that several plugins read (observed footprint,
loaded identifiers, free VRAM, staleness), written once so every plugin reads them
the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kubemoot.api import Model, ModelProvider, ProviderCapacity

__all__ = [
    "Placement",
    "footprint",
    "free_vram",
    "loaded_identifiers",
    "rfc3339",
    "stale_age",
]


@dataclass(frozen=True, slots=True)
class Placement:
    """One candidate: a Model and the ModelProvider its providerRef names (None if missing)."""

    model: Model
    provider: ModelProvider | None

    @property
    def name(self) -> str:
        """The Model resource name: the candidate's id in decision records."""
        return self.model.metadata.name

    @property
    def model_id(self) -> str:
        """The model identifier on the provider (``spec.model``, e.g. ``qwen3:32b``)."""
        return self.model.spec.model

    @property
    def capacity(self) -> ProviderCapacity | None:
        """The provider's ``status.capacity``, if known."""
        return None if self.provider is None else self.provider.capacity


def rfc3339(moment: datetime) -> str:
    """``2026-05-15T12:00:00Z`` for UTC, an explicit offset otherwise."""
    text = moment.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def footprint(placement: Placement) -> tuple[int | None, str]:
    """The Model's VRAM footprint in MiB and where the number came from.

    Observed beats declared (the spec's footprint source): the provider's observed
    footprint for this identifier, then a loaded copy's size, then the Model's own
    observed footprint, then the declared ``vramMib``.
    """
    capacity = placement.capacity
    model_id = placement.model_id
    if capacity is not None:
        observed = capacity.loaded_model_footprints.get(model_id)
        if observed is not None:
            return observed, "status.capacity.loadedModelFootprints"
        for loaded in capacity.loaded_models:
            if loaded.name == model_id and loaded.size_mib is not None:
                return loaded.size_mib, "status.capacity.loadedModels"
    status = placement.model.status
    if status is not None and status.footprint_mib is not None:
        return status.footprint_mib, "Model.status.footprintMiB"
    declared = placement.model.spec.vram_mib
    return declared, "Model.spec.vramMib"


def loaded_identifiers(provider: ModelProvider | None) -> frozenset[str]:
    """Model identifiers the provider reports as loaded."""
    if provider is None or provider.capacity is None:
        return frozenset()
    return frozenset(loaded.name for loaded in provider.capacity.loaded_models)


def free_vram(provider: ModelProvider | None) -> tuple[int, int] | None:
    """(free, total) MiB from the provider's own report; None when the total is unknown.

    Used VRAM comes from ``vramUsedMiB``, else the sum of the loaded models' sizes.
    """
    capacity = None if provider is None else provider.capacity
    if capacity is None or capacity.vram_total_mib is None:
        return None
    total = capacity.vram_total_mib
    used = capacity.vram_used_mib
    if used is None:
        used = sum(loaded.size_mib or 0 for loaded in capacity.loaded_models)
    return max(0, min(total, total - used)), total


def stale_age(provider: ModelProvider | None, now: datetime, max_age_seconds: int) -> float | None:
    """Age in seconds of a probed status older than the limit; None when fresh or hand-written.

    A status without ``lastProbedAt`` was declared by hand and is taken as it is.
    """
    status = None if provider is None else provider.status
    if status is None or status.last_probed_at is None:
        return None
    age = (now - status.last_probed_at).total_seconds()
    return age if age > max_age_seconds else None
