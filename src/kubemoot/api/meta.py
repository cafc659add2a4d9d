"""What every custom resource shares: object metadata, conditions and the base class.

Python attributes are snake_case; the wire names (aliases) are the camelCase of the CRDs.
Models accept either spelling (``populate_by_name``) and dump the wire form with
``model_dump(by_alias=True, exclude_none=True)``, or :meth:`Resource.to_manifest` for a
JSON-ready dictionary.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from kubemoot.api.bounds import Int64
from kubemoot.api.labels import (
    dns_label_problems,
    dns_subdomain_problems,
    validate_label_mapping,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_NAMESPACE",
    "GROUP",
    "VERSION",
    "Condition",
    "EitherMibSpelling",
    "ObjectMeta",
    "Resource",
    "Strict",
    "other_mib_spelling",
]

GROUP: Final = "kubemoot.ai"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "kubemoot.ai/v1alpha1"
# What kubectl assumes for a namespaced object whose manifest names no namespace.
DEFAULT_NAMESPACE = "default"


def other_mib_spelling(key: str) -> str | None:
    """``vramMiB`` ↔ ``vramMib``: the other spelling of a mebibyte field name, or None."""
    for one, other in (("MiB", "Mib"), ("Mib", "MiB")):
        if key.endswith(one) and len(key) > 3:
            return key[:-3] + other
    return None


class EitherMibSpelling(BaseModel):
    """A model whose mebibyte fields take both spellings (resources, scenarios, states)."""

    @model_validator(mode="before")
    @classmethod
    def _either_mib_spelling(cls, data: Any) -> Any:
        """``vramMib`` and ``vramMiB`` (and every other mebibyte field) mean one field.

        The spec writes ``Model.spec.vramMib``, the provider status writes ``…MiB``;
        people type either, so both spellings reach the same field (both at once is
        an error: which one was meant?).
        """
        if not isinstance(data, dict):
            return data
        known = {f.alias or name for name, f in cls.model_fields.items()}
        renamed: dict[str, Any] | None = None
        for key in data:
            other = other_mib_spelling(key) if isinstance(key, str) else None
            if other is None or key in known or other not in known:
                continue
            if other in data:
                raise ValueError(f"{key} and {other} are one field: give only one")
            renamed = renamed if renamed is not None else dict(data)
            renamed[other] = renamed.pop(key)
        return data if renamed is None else renamed


class Strict(EitherMibSpelling):
    """Base of every spec/status part: unknown fields are errors, so typos never pass silently."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class ObjectMeta(Strict):
    """The Kubernetes object metadata we read; server-managed fields are accepted as they come."""

    name: str
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    generation: Int64 | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    creation_timestamp: AwareDatetime | None = Field(default=None, alias="creationTimestamp")
    # Written by the API server or controllers; kept so objects read from a cluster validate.
    generate_name: str | None = Field(default=None, alias="generateName")
    deletion_timestamp: AwareDatetime | None = Field(default=None, alias="deletionTimestamp")
    deletion_grace_period_seconds: Int64 | None = Field(
        default=None, alias="deletionGracePeriodSeconds"
    )
    finalizers: list[str] | None = None
    owner_references: list[dict[str, Any]] | None = Field(default=None, alias="ownerReferences")
    managed_fields: list[dict[str, Any]] | None = Field(default=None, alias="managedFields")
    self_link: str | None = Field(default=None, alias="selfLink")

    @field_validator("name")
    @classmethod
    def _name_is_dns_subdomain(cls, name: str) -> str:
        problems = dns_subdomain_problems(name)
        if problems:
            raise ValueError(f'invalid name "{name}": {"; ".join(problems)}')
        return name

    @field_validator("namespace")
    @classmethod
    def _namespace_is_dns_label(cls, namespace: str | None) -> str | None:
        if namespace is not None:
            problems = dns_label_problems(namespace)
            if problems:
                raise ValueError(f'invalid namespace "{namespace}": {"; ".join(problems)}')
        return namespace

    @field_validator("labels", mode="before")
    @classmethod
    def _valid_labels(cls, labels: Any) -> Any:
        return {} if labels is None else validate_label_mapping(labels)

    @field_validator("annotations", mode="before")
    @classmethod
    def _annotations_default(cls, annotations: Any) -> Any:
        return {} if annotations is None else annotations


class Condition(Strict):
    """A Kubernetes status condition (``Ready``, ``Scheduled``, ``Valid`` …)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: AwareDatetime | None = Field(default=None, alias="lastTransitionTime")
    observed_generation: Int64 | None = Field(default=None, alias="observedGeneration")


class Resource(Strict):
    """Base of the custom resources; subclasses fix ``kind``, ``spec`` and ``status``.

    Class attributes describe the CRD: ``KIND``, ``PLURAL``, ``SHORT_NAMES``, ``NAMESPACED``.
    """

    KIND: ClassVar[str] = ""
    PLURAL: ClassVar[str] = ""
    SHORT_NAMES: ClassVar[tuple[str, ...]] = ()
    NAMESPACED: ClassVar[bool] = False

    api_version: Literal["kubemoot.ai/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: str
    metadata: ObjectMeta
    # Each kind narrows these to its own spec and status types; declared here so code that
    # handles any resource (the operator's diffing) can reach them.
    spec: Any = None
    status: Any = None

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return self.metadata.name

    @property
    def namespace(self) -> str | None:
        """The namespace of a namespaced kind (``default`` when unset); None if cluster-scoped."""
        if not self.NAMESPACED:
            return None
        return self.metadata.namespace or DEFAULT_NAMESPACE

    @property
    def labels(self) -> dict[str, str]:
        """``metadata.labels``."""
        return self.metadata.labels

    @property
    def key(self) -> str:
        """``Kind/namespace/name`` for namespaced kinds, ``Kind/name`` for cluster-scoped ones."""
        namespace = self.namespace
        if namespace is None:
            return f"{self.KIND}/{self.metadata.name}"
        return f"{self.KIND}/{namespace}/{self.metadata.name}"

    def to_manifest(self) -> dict[str, Any]:
        """The JSON-ready wire form (camelCase, no nulls, timestamps as RFC 3339 strings)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
