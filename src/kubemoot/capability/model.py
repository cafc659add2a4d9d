"""The ``PlacementRequest`` document: a workload contract and nodes with their evidence.

Every capability field of a node is optional: an absent field is missing evidence,
which its gate reports as UNKNOWN. Unknown fields anywhere are input errors that
name the field, so a typo never silently drops a requirement.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kubemoot.api.bounds import MAX_ITEMS, MAX_SECONDS, Count, Gib
from kubemoot.api.errors import InputError
from kubemoot.api.loader import validate_document

__all__ = [
    "API_VERSION",
    "DEFAULT_MAX_AGE_SECONDS",
    "KIND",
    "ArtifactRef",
    "ArtifactReplica",
    "Authority",
    "EgressPolicy",
    "EvidenceFreshness",
    "LicenseState",
    "NodeEvidence",
    "PlacementRequest",
    "RequestMetadata",
    "RequestSpec",
    "Telemetry",
    "Workload",
    "load_request",
    "parse_request",
]

API_VERSION = "kubemoot.ai/v1alpha1"
KIND = "PlacementRequest"
DEFAULT_MAX_AGE_SECONDS = 120.0  # DESIGN §4's freshness default, shared with the operator

LicenseState = Literal["ALLOW", "REVIEW_REQUIRED", "BLOCKED"]
Egress = Literal["none", "allowed"]


class _Document(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


def _utc(value: datetime | None) -> datetime | None:
    # A timestamp without a zone is read as UTC, like the RFC 3339 'Z' form users write.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


class ArtifactRef(_Document):
    """The exact artifact a workload needs: its name and immutable digest."""

    name: str = Field(min_length=1)
    digest: str = Field(min_length=1)


class EgressPolicy(_Document):
    """Network egress: ``none`` (no external egress) or ``allowed``."""

    egress: Egress | None = None


class Workload(_Document):
    """The workload contract. An absent requirement means the workload sets none."""

    id: str = Field(min_length=1)
    artifact: ArtifactRef | None = None
    runtime: str | None = Field(default=None, min_length=1)
    accelerators: list[str] | None = Field(default=None, min_length=1, max_length=MAX_ITEMS)
    memory_gib: Gib | None = Field(default=None, alias="memoryGiB")
    # The license state a node must show: only ALLOW clears a node (the spec's
    # licence gate), so nothing weaker can be asked for.
    license: LicenseState = "ALLOW"
    policy: EgressPolicy | None = None

    @field_validator("license")
    @classmethod
    def _only_allow(cls, value: str) -> str:
        if value != "ALLOW":
            raise ValueError(
                f"a workload must require ALLOW, not {value}: a node whose license state is "
                "REVIEW_REQUIRED or BLOCKED is never eligible"
            )
        return value


class Authority(_Document):
    """Where the license and policy states come from, and which version of them."""

    source: str = Field(min_length=1)
    version: str = Field(min_length=1)


class ArtifactReplica(_Document):
    """A replica a node holds, with its digest and state (VERIFIED, QUARANTINED, …)."""

    name: str = Field(min_length=1)
    digest: str = Field(min_length=1)
    state: str = Field(min_length=1)


class Telemetry(_Document):
    """Live load signals: used for preference scoring only, never as capability evidence."""

    utilization: float | None = Field(default=None, ge=0, le=1)
    queue_depth: Count | None = Field(default=None, alias="queueDepth")


class NodeEvidence(_Document):
    """One node's declared capability evidence, observed at ``observedAt``."""

    name: str = Field(min_length=1)
    observed_at: datetime | None = Field(default=None, alias="observedAt")
    accelerator: str | None = None
    memory_gib: Gib | None = Field(default=None, alias="memoryGiB")
    runtimes: list[str] | None = Field(default=None, max_length=MAX_ITEMS)
    artifacts: list[ArtifactReplica] | None = Field(default=None, max_length=MAX_ITEMS)
    license: LicenseState | None = None
    policy: EgressPolicy | None = None
    labels: dict[str, str | int | float | bool | None] | None = None
    telemetry: Telemetry | None = None

    _zone = field_validator("observed_at")(_utc)


class EvidenceFreshness(_Document):
    """How old capability evidence may be before its gates turn STALE."""

    max_age_seconds: float = Field(
        default=DEFAULT_MAX_AGE_SECONDS, alias="maxAgeSeconds", gt=0, le=MAX_SECONDS
    )


class RequestSpec(_Document):
    """The decision's inputs: when, how fresh, for what workload, over which nodes."""

    now: datetime | None = None
    freshness: EvidenceFreshness = Field(default_factory=EvidenceFreshness)
    workload: Workload
    nodes: list[NodeEvidence] = Field(default_factory=list, max_length=MAX_ITEMS)
    # The license/policy registry the node states were read from (recorded, not judged).
    authority: Authority | None = None

    _zone = field_validator("now")(_utc)

    @field_validator("nodes")
    @classmethod
    def _unique_names(cls, nodes: list[NodeEvidence]) -> list[NodeEvidence]:
        seen: set[str] = set()
        for node in nodes:
            if node.name in seen:
                raise ValueError(f"node name {node.name!r} appears more than once")
            seen.add(node.name)
        return nodes


class RequestMetadata(_Document):
    """Name and annotations (examples carry their expected outcome there)."""

    name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PlacementRequest(_Document):
    """``kind: PlacementRequest`` — one capability-aware placement to decide."""

    api_version: Literal["kubemoot.ai/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["PlacementRequest"]
    metadata: RequestMetadata = Field(default_factory=RequestMetadata)
    spec: RequestSpec


def parse_request(
    data: Any, *, file: str | None = None, document: int | None = None
) -> PlacementRequest:
    """Validate one loaded YAML/JSON document; errors name the file, document and field."""
    if not isinstance(data, dict):
        raise InputError(
            f"expected a mapping with kind {KIND}, got {type(data).__name__}",
            file=file,
            document=document,
        )
    kind = data.get("kind")
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    name = name if isinstance(name, str) else None
    if kind != KIND:
        raise InputError(
            f"expected kind {KIND}, got {kind!r}",
            file=file,
            document=document,
            name=name,
            field="kind",
        )
    return validate_document(
        PlacementRequest, data, file=file, document=document, kind=KIND, name=name
    )


def load_request(text: str, *, file: str | None = None) -> PlacementRequest:
    """Parse YAML text holding exactly one ``PlacementRequest`` document."""
    documents: list[tuple[int, Any]] = []
    index = 0
    try:
        for data in yaml.safe_load_all(text):
            if data is not None:
                documents.append((index, data))
            index += 1
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or error.context or "syntax error"
        raise InputError(
            f"YAML syntax error{where}: {problem}", file=file, document=index
        ) from None
    except Exception as error:  # PyYAML raises plain ValueErrors for impossible dates
        raise InputError(f"YAML error: {error}", file=file, document=index) from None
    if len(documents) != 1:
        raise InputError(f"expected exactly one {KIND} document, found {len(documents)}", file=file)
    position, data = documents[0]
    return parse_request(data, file=file, document=position)
