"""The fleet-wide model listings: ``/api/tags`` merged over providers, ``/v1/models``.

Pure functions over the providers' own ``/api/tags`` replies. One entry per model
name, as Ollama lists it, plus ``providers``: the servers that hold the model, so an
operator can see where a call for it may land (Ollama clients ignore the extra field).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from kubemoot.providers.ollama import tags_entry_problem

__all__ = ["checked_entries", "created_epoch", "merge_tags", "virtual_tag"]

log = logging.getLogger(__name__)


def merge_tags(replies: Sequence[tuple[str, dict[str, Any]]],
               virtual: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Each ``(provider, /api/tags reply)`` merged into one sorted list of entries."""
    merged: dict[str, dict[str, Any]] = {}
    holders: dict[str, set[str]] = {}
    for provider, entry in checked_entries(replies, tags_entry_problem):
        if isinstance(entry.get("name"), str):
            merged.setdefault(entry["name"], entry)
            holders.setdefault(entry["name"], set()).add(provider)
    out = [{**entry, "providers": sorted(holders[name])} for name, entry in merged.items()]
    out += [virtual_tag(name) for name in virtual if name not in merged]
    return sorted(out, key=lambda e: str(e["name"]))


def checked_entries(replies: Sequence[tuple[str, dict[str, Any]]],
                    problem: Callable[[object], str | None],
                    ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each ``(provider, entry)`` of the replies' ``models`` that the prober would accept
    (``problem`` is its check for that listing); the rest are left out with a warning
    naming the provider and the field, as the prober refuses them. Passed on unchecked,
    one engine's garbage (a name full of terminal escapes, a size no card has) reached
    every client listing the fleet, and a client that checks types (the official
    ``ollama`` one) failed on the whole list."""
    for provider, reply in replies:
        models = reply.get("models") or []
        if not isinstance(models, list):
            log.warning("gateway: the listing of %s left out: its models field is a %s, "
                        "not a list", provider, type(models).__name__)
            continue
        for entry in models:
            why = problem(entry)
            if why is None:
                yield provider, entry
            else:
                log.warning("gateway: an entry of %s left out of the listing: %s",
                            provider, why)


def virtual_tag(name: str) -> dict[str, Any]:
    """A ModelClass's entry: a name clients may call, held by no one server."""
    return {"name": name, "model": name, "modified_at": "1970-01-01T00:00:00Z", "size": 0,
            "digest": "", "providers": [],
            "details": {"format": "kubemoot-model-class", "family": "", "families": [],
                        "parameter_size": "", "quantization_level": ""}}


def created_epoch(modified_at: object) -> int:
    """``/v1/models``'s ``created``: an entry's ``modified_at`` in epoch seconds (0 when
    a provider gave none or an unreadable one)."""
    if not isinstance(modified_at, str) or not modified_at:
        return 0
    text = modified_at.strip().replace("Z", "+00:00")
    # Ollama writes Go's RFC 3339 with nanoseconds; Python reads at most microseconds
    head, dot, rest = text.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:min(digits, 6)]}{rest[digits:]}"
    try:
        return max(0, int(datetime.fromisoformat(text).timestamp()))
    except ValueError:
        return 0
