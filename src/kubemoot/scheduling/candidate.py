"""The unit the operator-side scheduler judges: a Model on the provider it names.

Also the few facts about a provider that several plugins read (observed footprint,
loaded identifiers, free VRAM, staleness), written once so every plugin reads them
the same way, and the fleet-wide footprint sightings a snapshot computes once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from kubemoot.api import Model, ModelProvider, ProviderCapacity

__all__ = [
    "Placement",
    "Sighting",
    "fleet_footprints",
    "footprint",
    "free_vram",
    "loaded_identifiers",
    "rfc3339",
    "stale_age",
]


@dataclass(frozen=True, slots=True)
class Sighting:
    """A footprint in MiB observed for a model identifier, and where it was seen."""

    mib: int
    source: str  # e.g. "ModelProvider pa status.capacity.loadedModels"


@dataclass(frozen=True, slots=True)
class Placement:
    """One candidate: a Model and the ModelProvider its providerRef names (None if missing).

    ``seen_in_fleet`` is the footprint of the Model's identifier observed on any provider
    (see :func:`fleet_footprints`); the snapshot fills it in once for every candidate.
    """

    model: Model
    provider: ModelProvider | None
    seen_in_fleet: Sighting | None = None

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


def _own_sightings(capacity: ProviderCapacity) -> Iterable[tuple[str, int, str]]:
    """(identifier, MiB, field) for every footprint one provider reports observing."""
    for model_id, mib in capacity.loaded_model_footprints.items():
        yield model_id, mib, "status.capacity.loadedModelFootprints"
    for loaded in capacity.loaded_models:
        if loaded.size_mib is not None:
            yield loaded.name, loaded.size_mib, "status.capacity.loadedModels"


def fleet_footprints(
    providers: Iterable[ModelProvider], models: Iterable[Model] = ()
) -> dict[str, Sighting]:
    """Model identifier → its observed footprint on any provider; computed once per snapshot.

    Sources are every provider's ``loadedModelFootprints`` and ``loadedModels`` and
    every Model's ``status.footprintMiB`` (an observation made on its own provider).
    When providers disagree, the **largest** sighting wins (ties: the first by provider,
    then by Model name): the VRAM gate is a proof that a model fits, and it must not
    rest on the smallest copy ever seen when the same identifier has been seen taking
    more (a longer context or more parallel slots grow the cache). A snapshot holds no
    order of observation, so "the first observed" would be an arbitrary pick.
    """
    seen: dict[str, Sighting] = {}

    def note(model_id: str, mib: int, source: str) -> None:
        best = seen.get(model_id)
        if best is None or mib > best.mib:
            seen[model_id] = Sighting(mib, source)

    for provider in sorted(providers, key=lambda p: p.metadata.name):
        if provider.capacity is not None:
            for model_id, mib, field in _own_sightings(provider.capacity):
                note(model_id, mib, f"ModelProvider {provider.metadata.name} {field}")
    for model in sorted(models, key=lambda m: m.metadata.name):
        if model.status is not None and model.status.footprint_mib is not None:
            note(
                model.spec.model,
                model.status.footprint_mib,
                f"Model {model.metadata.name} status.footprintMiB",
            )
    return seen


def footprint(placement: Placement) -> tuple[int | None, str]:
    """The Model's VRAM footprint in MiB and where the number came from.

    Observed beats declared (the spec: the observed footprint of M from any provider
    that has loaded it, falling back to declared). The candidate's own provider comes
    first (its footprint for this identifier, then a loaded copy's size), then the
    Model's own observed footprint, then the identifier's footprint seen anywhere in
    the fleet, and only then the declared ``vramMib``.
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
    elsewhere = placement.seen_in_fleet
    if elsewhere is not None:
        return elsewhere.mib, elsewhere.source
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
