"""From a probe's provider-state document to ModelProvider and Model status.

The prober (:mod:`kubemoot.providers.prober`) asks the engine what it holds; this module
turns its answer into the two statuses the operator owns:

* ``ModelProvider.status``: ``ready``, ``lastProbedAt``, ``capacity`` and a ``Ready``
  condition;
* ``Model.status``: ``ready`` when its provider is ready and reports the model available
  (pulled or loaded), ``footprintMiB`` as first observed, and a ``Ready`` condition.

Ollama does not report the card's total VRAM. It comes from a DCGM exporter or from the
ModelProvider's annotations (:data:`VRAM_TOTAL_ANNOTATION`, :data:`DCGM_URL_ANNOTATION`);
with neither, the total a person declared in ``status.capacity.vramTotalMiB`` is kept,
and without that it stays unknown (the VRAM gate then answers UNKNOWN, never FAIL).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from kubemoot.api import InputError, Model, ModelProvider
from kubemoot.clock import Clock
from kubemoot.operator.status import condition, merge_conditions, rfc3339, to_datetime
from kubemoot.providers.factory import ProviderClients
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.scheduling.warnings import PROVIDER_NOT_FOUND, missing_provider
from kubemoot.store.documents import ProviderState

__all__ = [
    "DCGM_URL_ANNOTATION",
    "VRAM_TOTAL_ANNOTATION",
    "client_for",
    "model_status",
    "provider_status",
]

VRAM_TOTAL_ANNOTATION = "kubemoot.ai/vram-total-mib"
DCGM_URL_ANNOTATION = "kubemoot.ai/dcgm-url"
DCGM_GPU_ANNOTATION = "kubemoot.ai/dcgm-gpu"


def _total_from_annotation(provider: ModelProvider) -> int | None:
    text = provider.metadata.annotations.get(VRAM_TOTAL_ANNOTATION)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value <= 0:
        raise InputError(
            f'must be a positive whole number of MiB, got "{text}"',
            kind=provider.KIND,
            name=provider.name,
            field=f"metadata.annotations[{VRAM_TOTAL_ANNOTATION}]",
        )
    return value


def client_for(provider: ModelProvider, *, clock: Clock, timeout: float) -> OllamaProvider:
    """The Ollama-API client of a ModelProvider; ``InputError`` names a bad annotation."""
    if provider.spec.type != "ollama":
        raise InputError(
            f'provider type "{provider.spec.type}" is not supported; use "ollama"',
            kind=provider.KIND, name=provider.name, field="spec.type",
        )
    annotations = provider.metadata.annotations
    # the probe's own timeout bounds the whole call, so no deployment timeout applies
    return ProviderClients(clock=clock).client(
        provider.name,
        provider.spec.endpoint,
        context_length=provider.spec.context_length,
        num_parallel=provider.spec.num_parallel or 1,
        reserve_mib=provider.spec.reserve_mib,
        total_vram_mib=_total_from_annotation(provider),
        timeout=timeout,
        deadline=timeout,  # --probe-timeout bounds the whole probe, not each read
        max_retries=0,  # the next probe is the retry
        dcgm_url=annotations.get(DCGM_URL_ANNOTATION),
        dcgm_gpu=annotations.get(DCGM_GPU_ANNOTATION),
    )


def provider_status(
    state: ProviderState,
    provider: ModelProvider,
    *,
    agent_count: int,
    now: datetime,
) -> dict[str, Any]:
    """The ``ModelProvider.status`` a probe yields, in wire form (nulls for unknowns)."""
    previous = provider.status
    capacity = None if previous is None else previous.capacity
    total = state.total_vram_mib
    if total is None and capacity is not None:
        total = capacity.vram_total_mib  # declared by hand; the probe cannot know better
    loaded = [
        {
            "name": item.name,
            "sizeMiB": item.size_mib,
            "contextLength": item.context_length,
            "digest": item.digest,
        }
        for item in state.loaded_models
    ]
    digests = sorted({item.digest for item in state.loaded_models if item.digest})
    probed = now if state.last_probed_at is None else to_datetime(state.last_probed_at)
    if state.ready:
        ready = condition("Ready", True, "ProbeSucceeded",
                          f"{state.endpoint} answered; {len(loaded)} model(s) loaded", now=now)
    else:
        ready = condition("Ready", False, "ProbeFailed", state.reason or "probe failed", now=now)
    old_conditions = [] if previous is None else [
        c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in previous.conditions
    ]
    return {
        "ready": state.ready,
        "observedGeneration": provider.metadata.generation,
        "lastProbedAt": rfc3339(probed),
        "runtimeVersion": state.runtime_version,
        "capacity": {
            "vramTotalMiB": total,
            "vramUsedMiB": state.used_vram_mib,
            "maxParallel": state.max_parallel,
            "agentCount": agent_count,
            "contextLength": state.context_length,
            "loadedModels": [{k: v for k, v in m.items() if v is not None} for m in loaded],
            "loadedModelFootprints": dict(state.loaded_model_footprints),
            "digests": digests,
            # `kubectl get` prints only the first match of a [*] path: publish them joined.
            "loadedModelNames": ", ".join(str(m["name"]) for m in loaded) or None,
        },
        "conditions": merge_conditions(old_conditions, [ready]),
    }


def model_status(
    model: Model,
    state: ProviderState | None,
    *,
    provider_known: bool,
    now: datetime,
    known_providers: Collection[str] = (),
) -> dict[str, Any] | None:
    """The ``Model.status`` for its provider's latest probe; None before any probe."""
    model_id = model.spec.model
    provider = model.spec.provider_ref
    if not provider_known:
        warning = missing_provider(model, known_providers)
        ready, reason = False, PROVIDER_NOT_FOUND
        message = f'ModelProvider "{provider}" does not exist' if warning is None else (
            f"{warning.field}: {warning.message}")
    elif state is None:
        return None  # not probed yet: a Model without status is taken as Ready
    elif not state.ready:
        ready, reason = False, "ProviderNotReady"
        message = f"provider {provider} is not ready: {state.reason or 'probe failed'}"
    elif model_id in state.disk_sizes_mib or any(m.name == model_id for m in state.loaded_models):
        ready, reason = True, "Available"
        message = f"{model_id} is available on {provider}"
    else:
        ready, reason = False, "NotAvailable"
        message = f"{model_id} is neither pulled nor loaded on {provider}"
    footprint = None if state is None else state.loaded_model_footprints.get(model_id)
    if footprint is None and model.status is not None:
        footprint = model.status.footprint_mib  # first observation wins, as in the prober
    old = [] if model.status is None else [
        c.model_dump(mode="json", by_alias=True, exclude_none=True)
        for c in model.status.conditions
    ]
    return {
        "observedGeneration": model.metadata.generation,
        "ready": ready,
        "footprintMiB": footprint,
        "conditions": merge_conditions(old, [condition("Ready", ready, reason, message, now=now)]),
    }


def without_nulls(data: Any) -> Any:
    """A copy without null values, to compare a wanted status with a stored one."""
    if isinstance(data, Mapping):
        return {k: without_nulls(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [without_nulls(v) for v in data]
    return data
