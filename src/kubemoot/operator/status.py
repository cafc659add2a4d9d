"""Pure helpers for status writes: conditions, RFC 3339 times and merge-patch diffs.

The operator writes only when something changed. It builds the status it wants, diffs
it against the status the object has, and sends the difference as a JSON merge patch
(RFC 7386); an empty difference means no request at all. Condition transition times
move only when a condition's status moves, as Kubernetes conventions ask.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "condition",
    "find_condition",
    "merge_conditions",
    "merge_patch",
    "rfc3339",
    "to_datetime",
]


def to_datetime(epoch: float) -> datetime:
    """Seconds since the epoch (the injected clock's unit) as an aware UTC datetime."""
    return datetime.fromtimestamp(epoch, UTC)


def rfc3339(moment: datetime) -> str:
    """``2026-05-15T15:30:00Z``: second precision, as the API server stores times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    kind: str, status: bool | str, reason: str, message: str, *, now: datetime
) -> dict[str, Any]:
    """A condition in wire form; ``status`` True/False become "True"/"False"."""
    text = status if isinstance(status, str) else ("True" if status else "False")
    return {
        "type": kind,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(now),
    }


def find_condition(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    """The condition of one type, if present."""
    return next((item for item in conditions if item.get("type") == kind), None)


def merge_conditions(
    existing: Iterable[Mapping[str, Any]], updates: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``existing`` with each update put in place of its type (appended when new).

    An update whose status equals the old one keeps the old ``lastTransitionTime``:
    the time says when the condition last flipped, not when it was last computed.
    """
    merged = [dict(item) for item in existing if isinstance(item, Mapping)]
    for update in updates:
        new = dict(update)
        for index, old in enumerate(merged):
            if old.get("type") == new.get("type"):
                if old.get("status") == new.get("status") and old.get("lastTransitionTime"):
                    new["lastTransitionTime"] = old["lastTransitionTime"]
                merged[index] = new
                break
        else:
            merged.append(new)
    return merged


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch turning ``old`` into ``new``; ``{}`` when they are equal.

    Keys that vanish become ``None`` (a delete in merge-patch terms); lists and scalars
    are replaced whole, as merge patch has no list operations.
    """
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            if value is not None:
                patch[key] = value
        elif isinstance(value, Mapping) and isinstance(old[key], Mapping):
            inner = merge_patch(old[key], value)
            if inner != {}:
                patch[key] = inner
        elif value != old[key]:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch
