"""CustomResourceDefinition manifests (apiextensions.k8s.io/v1) generated from the models.

The schemas come from the pydantic models through :mod:`kubemoot.api.schema`, so the
cluster and the loader agree on every field. :func:`validate_against_crd` checks a
manifest against the generated schema without a cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import cache
from typing import Any

from kubemoot.api.kinds import RESOURCE_TYPES
from kubemoot.api.meta import GROUP, VERSION, Resource
from kubemoot.api.schema import structural_schema, validate_value

__all__ = ["PRINTER_COLUMNS", "crd_for", "crd_manifests", "validate_against_crd"]

CATEGORY = "kubemoot"


def _column(name: str, path: str, kind: str = "string", **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, "jsonPath": path, **extra}


_AGE = _column("Age", ".metadata.creationTimestamp", "date")

# What `kubectl get` shows per kind: the few fields a person scans a list for.
PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "Model": [
        _column("Model", ".spec.model"),
        _column("Provider", ".spec.providerRef"),
        _column("VRAM", ".spec.vramMib", "integer", description="Declared footprint in MiB"),
        _column("Ready", ".status.ready", "boolean"),
        _AGE,
    ],
    "ModelProvider": [
        _column("Endpoint", ".spec.endpoint"),
        _column("Ready", ".status.ready", "boolean"),
        _column("VRAM Total", ".status.capacity.vramTotalMiB", "integer", description="MiB"),
        _column("Loaded", ".status.capacity.loadedModelNames", priority=1),
        _column("Last Probed", ".status.lastProbedAt", "date"),
    ],
    "Agent": [
        _column("Model", ".status.scheduling.model"),
        _column("Provider", ".status.scheduling.provider"),
        _column("Scheduled", '.status.conditions[?(@.type=="Scheduled")].status'),
        _column("Role", ".spec.discussRole", priority=1),
        _AGE,
    ],
    "CrewSchedulingPolicy": [
        _column("Crew", ".spec.crewRef"),
        _column("Archetype", ".spec.archetypeRef"),
        _column("Valid", '.status.conditions[?(@.type=="Valid")].status'),
        _AGE,
    ],
    "MootArchetype": [
        _column("Phases", ".status.phaseNames"),
        _AGE,
    ],
    "KubemootConfig": [
        _column("Strategy", ".spec.scheduler.strategy"),
        _AGE,
    ],
    "ModelClass": [
        _column("Bias", ".spec.qualityBias"),
        _column("Tolerance", ".spec.tolerance", "number"),
        _AGE,
    ],
}


_DESCRIPTIONS = {
    "Model": "A model on a provider: labels say what it is, spec.vramMib what it needs.",
    "ModelProvider": "An inference engine endpoint and the capacity it reports.",
    "Agent": "A crew member: its capabilities and role; status says where it is scheduled.",
    "CrewSchedulingPolicy": "Require/prefer label selectors per discussion phase for a crew.",
    "MootArchetype": "A coordination model and the phase names policies may use.",
    "KubemootConfig": "Cluster-wide scheduler settings.",
    "ModelClass": "A virtual model name: the Models a selector admits, ranked by preference.",
}


def _object_schema(cls: type[Resource]) -> dict[str, Any]:
    schema = {"description": _DESCRIPTIONS[cls.KIND], **structural_schema(cls)}
    properties = schema["properties"]
    # The API server owns metadata's schema; a CRD may only say it is an object.
    properties["metadata"] = {"type": "object"}
    for name in ("apiVersion", "kind"):
        properties[name] = {"type": "string"}
    schema["required"] = [name for name in schema.get("required", []) if name != "metadata"]
    if not schema["required"]:
        del schema["required"]
    conditions = properties.get("status", {}).get("properties", {}).get("conditions")
    if conditions is not None:
        # One condition per type, merged by type (server-side apply, strategic merge),
        # as the Kubernetes API conventions ask of every conditions list.
        conditions["x-kubernetes-list-type"] = "map"
        conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def crd_for(cls: type[Resource]) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{cls.PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": cls.KIND,
                "listKind": f"{cls.KIND}List",
                "plural": cls.PLURAL,
                "singular": cls.KIND.lower(),
                "shortNames": list(cls.SHORT_NAMES),
                "categories": [CATEGORY],
            },
            "scope": "Namespaced" if cls.NAMESPACED else "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _object_schema(cls)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS[cls.KIND],
                }
            ],
        },
    }


@cache
def _manifests() -> tuple[dict[str, Any], ...]:
    return tuple(crd_for(cls) for cls in RESOURCE_TYPES.values())


def crd_manifests() -> list[dict[str, Any]]:
    """One CRD per kind (Model, ModelProvider, Agent, CrewSchedulingPolicy, MootArchetype,
    KubemootConfig, ModelClass); a fresh copy each call, so callers may change it."""
    return copy.deepcopy(list(_manifests()))


def validate_against_crd(obj: Mapping[str, Any]) -> list[str]:
    """Problems of a manifest against its generated CRD schema; empty when it conforms.

    Checks what the API server checks from the schema: apiVersion and kind, types,
    required fields, enums, numeric bounds, date-times and unknown fields (outside the
    places that keep unknown fields). Cross-field rules (label syntax, operator values)
    are the models' job; see :func:`kubemoot.api.loader.parse_manifest`.
    """
    if not isinstance(obj, Mapping):
        return [f"<root>: expected object, got {type(obj).__name__}"]
    kind = obj.get("kind")
    crd = next(
        (item for item in _manifests() if item["spec"]["names"]["kind"] == kind), None
    )
    if crd is None:
        return [f"kind: no CRD for kind {kind!r}"]
    problems: list[str] = []
    expected_version = f"{GROUP}/{VERSION}"
    if obj.get("apiVersion") != expected_version:
        problems.append(f"apiVersion: expected {expected_version}, got {obj.get('apiVersion')!r}")
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        problems.append("metadata.name: required field is missing")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    problems.extend(validate_value(obj, schema))
    return problems
