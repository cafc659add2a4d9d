"""Small builders of custom resources for table tests across the project.

Each returns a validated model, so a test that builds something invalid fails at the
builder with the same message a user would see. Keyword arguments use the Python
(snake_case) names of the models; the wire (camelCase) names are accepted too.

    m = model("qwen3-32b", vram_mib=20480, labels={"params": "32B"})
    p = provider("ollama-a", vram_total_mib=32768, loaded=[("qwen3:32b", 18432)])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kubemoot.api import (
    CREW_LABEL,
    Agent,
    CrewSchedulingPolicy,
    LabelSelector,
    LoadedModel,
    Model,
    ModelProvider,
    MootArchetype,
    SchedulingRule,
    TopologySpread,
)

__all__ = [
    "agent",
    "archetype",
    "model",
    "policy",
    "prefer",
    "provider",
    "rule",
    "selector",
]

LoadedSpec = str | tuple[str, int] | tuple[str, int, int] | LoadedModel | Mapping[str, Any]


def model(
    name: str,
    *,
    model_id: str | None = None,
    provider: str = "ollama-a",
    vram_mib: int | None = None,
    labels: Mapping[str, str] | None = None,
    ready: bool | None = None,
    **spec: Any,
) -> Model:
    """A Model; ``model_id`` defaults to ``name`` with its last ``-`` turned into ``:``
    (``qwen3-32b`` → ``qwen3:32b``). ``ready`` None leaves the status out (taken as Ready)."""
    if model_id is None:
        head, dash, tail = name.rpartition("-")
        model_id = f"{head}:{tail}" if dash else name
    data: dict[str, Any] = {
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"model": model_id, "providerRef": provider, "vramMib": vram_mib, **spec},
    }
    if ready is not None:
        data["status"] = {"ready": ready}
    return Model.model_validate(data)


def _loaded_entry(item: LoadedSpec) -> dict[str, Any]:
    if isinstance(item, LoadedModel):
        return item.model_dump(by_alias=True, exclude_none=True)
    if isinstance(item, str):
        return {"name": item}
    if isinstance(item, tuple):
        entry: dict[str, Any] = {"name": item[0], "sizeMiB": item[1]}
        if len(item) > 2:
            entry["contextLength"] = item[2]
        return entry
    return dict(item)


def provider(
    name: str,
    *,
    endpoint: str | None = None,
    vram_total_mib: int | None = None,
    ready: bool | None = True,
    max_parallel: int | None = 1,
    agent_count: int | None = 0,
    loaded: Iterable[LoadedSpec] = (),
    weight: int | None = None,
    last_probed_at: datetime | str | None = None,
    vram_used_mib: int | None = None,
    capacity_context_length: int | None = None,
    digests: Sequence[str] = (),
    **spec: Any,
) -> ModelProvider:
    """A ModelProvider with a status; ``vram_total_mib`` None means the total is unknown.

    ``loaded`` takes model identifiers, ``(identifier, sizeMiB[, contextLength])`` tuples,
    ``LoadedModel`` objects or dicts; each sized entry is also recorded as an observed
    footprint. ``**spec`` sets spec fields (``reserve_mib``, ``context_length`` …).
    """
    entries = [_loaded_entry(item) for item in loaded]
    footprints = {e["name"]: e["sizeMiB"] for e in entries if e.get("sizeMiB") is not None}
    spec_data: dict[str, Any] = {"endpoint": endpoint or f"http://{name}:11434", **spec}
    if weight is not None:
        spec_data["scheduling"] = {"weight": weight}
    capacity = {
        "vramTotalMiB": vram_total_mib,
        "vramUsedMiB": vram_used_mib,
        "maxParallel": max_parallel,
        "agentCount": agent_count,
        "contextLength": capacity_context_length,
        "loadedModels": entries,
        "loadedModelFootprints": footprints,
        "digests": list(digests),
    }
    status = {"ready": ready, "lastProbedAt": last_probed_at, "capacity": capacity}
    return ModelProvider.model_validate(
        {"metadata": {"name": name}, "spec": spec_data, "status": status}
    )


def agent(
    name: str,
    namespace: str = "crew-a",
    *,
    capabilities: Iterable[str] = (),
    crew: str | None = None,
    role: str | None = "tooler",
    labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> Agent:
    """An Agent; ``crew`` sets the ``kubemoot.ai/crew`` label that picks its policy."""
    all_labels = dict(labels or {})
    if crew is not None:
        all_labels[CREW_LABEL] = crew
    return Agent.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace, "labels": all_labels},
            "spec": {"capabilities": list(capabilities), "discussRole": role, **spec},
        }
    )


def selector(
    match_labels: Mapping[str, str] | None = None,
    *expressions: tuple[str, str] | tuple[str, str, Sequence[str]],
) -> LabelSelector:
    """``selector({"family": "qwen3"}, ("params", "In", ["14B", "32B"]), ("gpu", "Exists"))``."""
    parsed = [
        {"key": item[0], "operator": item[1], "values": list(item[2]) if len(item) > 2 else []}
        for item in expressions
    ]
    return LabelSelector.model_validate(
        {"matchLabels": dict(match_labels or {}), "matchExpressions": parsed}
    )


def prefer(weight: int, sel: LabelSelector | Mapping[str, str]) -> dict[str, Any]:
    """A prefer term; a plain mapping is taken as ``matchLabels``."""
    chosen = sel if isinstance(sel, LabelSelector) else selector(sel)
    return {"weight": weight, "selector": chosen}


def rule(
    phase: str,
    *,
    require: LabelSelector | Mapping[str, str] | None = None,
    prefer: Iterable[Mapping[str, Any] | tuple[int, LabelSelector | Mapping[str, str]]] = (),
) -> SchedulingRule:
    """A SchedulingRule; ``require`` may be a mapping of matchLabels, ``prefer`` may hold
    ``(weight, selector-or-matchLabels)`` tuples."""
    terms = []
    for term in prefer:
        if isinstance(term, tuple):
            weight, sel = term
            chosen = sel if isinstance(sel, LabelSelector) else selector(sel)
            terms.append({"weight": weight, "selector": chosen})
        else:
            terms.append(dict(term))
    required = (
        require if require is None or isinstance(require, LabelSelector) else selector(require)
    )
    return SchedulingRule.model_validate({"phase": phase, "require": required, "prefer": terms})


def policy(
    name: str,
    namespace: str = "crew-a",
    *,
    crew_ref: str | None = None,
    rules: Iterable[SchedulingRule | Mapping[str, Any]] = (),
    quality_bias: Mapping[str, str] | None = None,
    spread: TopologySpread | Mapping[str, Any] | Sequence[str] | None = None,
    archetype_ref: str | None = None,
    max_age_seconds: int | None = None,
) -> CrewSchedulingPolicy:
    """A CrewSchedulingPolicy; ``spread`` may be a list of phase keys (ScheduleAnyway on
    ``provider``), a mapping or a TopologySpread."""
    spread_value: Any = spread
    if isinstance(spread, Sequence) and not isinstance(spread, str):
        spread_value = {"phaseKeys": list(spread)}
    spec: dict[str, Any] = {
        "crewRef": crew_ref,
        "archetypeRef": archetype_ref,
        "qualityBias": dict(quality_bias or {}),
        "rules": list(rules),
        "topologySpread": spread_value,
    }
    if max_age_seconds is not None:
        spec["freshness"] = {"maxAgeSeconds": max_age_seconds}
    return CrewSchedulingPolicy.model_validate(
        {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    )


def archetype(
    name: str = "consent-3",
    *,
    phases: Iterable[str] = ("mulling", "triage"),
    roles: Iterable[str] = ("coordinator", "tooler", "analyst"),
) -> MootArchetype:
    """A MootArchetype; the default is the consent-3 archetype's two scheduling phases."""
    return MootArchetype.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"phases": [{"name": phase} for phase in phases], "roles": list(roles)},
        }
    )
