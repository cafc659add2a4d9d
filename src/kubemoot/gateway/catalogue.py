"""Which models the fleet offers, and what a client's model name means.

Pure functions over a :class:`~kubemoot.runtime.snapshot.FleetSnapshot` and the Model
resources the gateway was given: a name is known when a provider lists it (on disk or
loaded) or a Model resource declares it; ``qwen3`` means ``qwen3:latest`` as in Ollama.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from kubemoot.gateway.errors import unknown_model
from kubemoot.runtime.snapshot import FleetSnapshot

__all__ = ["known_models", "largest_context", "resolve_name", "unknown_model"]


def known_models(fleet: FleetSnapshot, declared: Iterable[str] = ()) -> set[str]:
    """Every model some provider lists or a Model resource declares."""
    names = set(declared)
    for p in fleet.providers:
        names.update(p.state.disk_sizes_mib)
        names.update(m.name for m in p.state.loaded_models)
    return names


def resolve_name(name: str, known: Collection[str]) -> str | None:
    """The catalogue name ``name`` stands for, or ``None`` when nobody offers it."""
    if name in known:
        return name
    if ":" not in name and f"{name}:latest" in known:
        return f"{name}:latest"
    return None


def largest_context(fleet: FleetSnapshot, models: Iterable[str]) -> int | None:
    """The largest context any provider offers for any of ``models`` (None: unknown)."""
    contexts = [c for p in fleet.providers for m in models
                if (c := p.context_for(m)) is not None]
    return max(contexts) if contexts else None
