"""Warnings about a cluster's objects: not errors, but a person almost surely erred.

A Model whose ``spec.providerRef`` names no ModelProvider is well-formed and simply
never a candidate (its ProviderReady gate fails). Left at that, a typo shows up only in
one Agent's ``--explain`` output; these warnings name it where people look: the
Model's condition and events in a cluster, and stderr of ``kubemoot schedule``.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from kubemoot.api import Model

__all__ = ["PROVIDER_NOT_FOUND", "ObjectWarning", "missing_provider", "snapshot_warnings"]

PROVIDER_NOT_FOUND = "ProviderNotFound"


@dataclass(frozen=True, slots=True)
class ObjectWarning:
    """One warning: the object, the field, a reason (CamelCase) and a message."""

    kind: str
    name: str
    field: str
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}, field {self.field}: {self.message}"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "field": self.field,
                "reason": self.reason, "message": self.message}


def missing_provider(model: Model, providers: Collection[str]) -> ObjectWarning | None:
    """The warning for a Model whose providerRef names no known provider, else None."""
    ref = model.spec.provider_ref
    if ref in providers:
        return None
    close = difflib.get_close_matches(ref, sorted(providers), n=1)
    if close:
        hint = f'; did you mean "{close[0]}"?'
    elif providers:
        hint = f" (known: {', '.join(sorted(providers))})"
    else:
        hint = " (there are no ModelProviders)"
    return ObjectWarning(
        kind=model.KIND,
        name=model.metadata.name,
        field="spec.providerRef",
        reason=PROVIDER_NOT_FOUND,
        message=f'ModelProvider "{ref}" does not exist, so the Model is never a '
        f"candidate{hint}",
    )


def snapshot_warnings(models: Iterable[Model], providers: Collection[str]) -> list[ObjectWarning]:
    """Every warning about ``models`` given the provider names, in Model name order."""
    found = (missing_provider(m, providers) for m in sorted(models, key=lambda m: m.metadata.name))
    return [warning for warning in found if warning is not None]
