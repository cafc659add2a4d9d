"""Builders for PlacementRequest documents: a qualifying default, changed per test."""

from __future__ import annotations

from typing import Any

from kubemoot.capability import PlacementRequest, parse_request

NOW = "2026-05-15T12:00:00Z"
FRESH = "2026-05-15T11:59:00Z"  # 60 s before NOW
OLD = "2026-05-15T11:00:00Z"  # 3600 s before NOW
DIGEST = "sha256:D-GPU"
VERIFIED = {"name": "media-model", "digest": DIGEST, "state": "VERIFIED"}
ABSENT = object()  # marks a field to leave out of the document


def workload(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "W-GPU-7",
        "artifact": {"name": "media-model", "digest": DIGEST},
        "runtime": "R3",
        "accelerators": ["H100", "L40S"],
        "memoryGiB": 24,
        "license": "ALLOW",
        "policy": {"egress": "none"},
    }
    return _apply(data, changes)


def node(name: str = "N1", **changes: Any) -> dict[str, Any]:
    """A node that qualifies on every gate, unless changed."""
    data: dict[str, Any] = {
        "name": name,
        "observedAt": FRESH,
        "accelerator": "H100",
        "memoryGiB": 48,
        "runtimes": ["R3"],
        "artifacts": [dict(VERIFIED)],
        "license": "ALLOW",
        "policy": {"egress": "none"},
        "telemetry": {"utilization": 0.2, "queueDepth": 1},
    }
    return _apply(data, changes)


def document(
    *nodes: dict[str, Any], max_age: float | None = 300, now: str | None = NOW, **work: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"workload": workload(**work), "nodes": list(nodes)}
    if now is not None:
        spec["now"] = now
    if max_age is not None:
        spec["freshness"] = {"maxAgeSeconds": max_age}
    return {
        "apiVersion": "kubemoot.ai/v1alpha1",
        "kind": "PlacementRequest",
        "metadata": {"name": "test"},
        "spec": spec,
    }


def request(*nodes: dict[str, Any], **kwargs: Any) -> PlacementRequest:
    return parse_request(document(*nodes, **kwargs))


def _apply(data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if value is ABSENT:
            data.pop(key, None)
        else:
            data[key] = value
    return data
