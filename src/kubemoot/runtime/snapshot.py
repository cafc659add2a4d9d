"""What one placement decision looks at: a frozen picture of the fleet.

The pure cost, filter and eviction code works only on these values, so it can be
tested, benchmarked and simulated without a store, a clock or a network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kubemoot.store.documents import ProviderState, Ticket, TicketState


@dataclass(frozen=True, slots=True)
class ProviderSnapshot:
    """One provider: its published state, its live tickets, its latency and circuit."""

    state: ProviderState
    tickets: tuple[Ticket, ...] = ()  # active (unexpired) at the snapshot's time
    latency_seconds: float = 30.0
    circuit_open: bool = False
    # Derived once: a placement asks these questions for every provider and model.
    _residents: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _tickets_by_model: dict[str, list[Ticket]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _victims: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        residents: dict[str, int] = {}
        for loaded in self.state.loaded_models:
            residents[loaded.name] = residents.get(loaded.name, 0) + loaded.size_mib
        by_model: dict[str, list[Ticket]] = {}
        for t in self.tickets:
            by_model.setdefault(t.model, []).append(t)
        object.__setattr__(self, "_residents", residents)
        object.__setattr__(self, "_tickets_by_model", by_model)
        object.__setattr__(
            self, "_victims", frozenset(v for t in self.tickets for v in t.evicts)
        )

    @property
    def name(self) -> str:
        return self.state.provider

    @property
    def residents(self) -> dict[str, int]:
        """Models the engine reports loaded, with their footprints in MiB."""
        return dict(self._residents)

    @property
    def resident_total(self) -> int:
        """Σ footprints of the resident models, in MiB."""
        return sum(self._residents.values())

    def is_resident(self, model: str) -> bool:
        return model in self._residents

    def planned_victims(self) -> frozenset[str]:
        """Models some active ticket here plans to unload."""
        return self._victims

    def tickets_for(self, model: str) -> list[Ticket]:
        return list(self._tickets_by_model.get(model, ()))

    def has_tickets_for(self, model: str) -> bool:
        return model in self._tickets_by_model

    def in_flight(self, model: str) -> list[Ticket]:
        """Calls running (or waiting for their load) on this provider's copy of ``model``.

        A held plan is not a call yet, so it takes no slot.
        """
        return [
            t for t in self._tickets_by_model.get(model, ()) if t.state is not TicketState.HELD
        ]

    def loading_tickets(self, model: str) -> list[Ticket]:
        """Tickets whose memory is a copy of ``model`` not yet reported resident."""
        if model in self._residents:
            return []
        return [t for t in self._tickets_by_model.get(model, ()) if t.model_footprint_mib > 0]

    def has_copy(self, model: str) -> bool:
        """Resident, or being loaded by a ticket."""
        return model in self._residents or bool(self.loading_tickets(model))

    def context_for(self, model: str) -> int | None:
        """Context of (this provider, model): observed when loaded, else configured."""
        if model in self._residents:
            for loaded in self.state.loaded_models:
                if loaded.name == model and loaded.context_length is not None:
                    return loaded.context_length
        return self.state.context_length


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """Every provider at one instant ``now`` (seconds since the epoch)."""

    now: float
    providers: tuple[ProviderSnapshot, ...] = ()
    _by_name: Mapping[str, ProviderSnapshot] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, now: float, providers: list[ProviderSnapshot]) -> FleetSnapshot:
        ordered = tuple(sorted(providers, key=lambda p: p.name))
        return cls(now=now, providers=ordered, _by_name={p.name: p for p in ordered})

    def provider(self, name: str) -> ProviderSnapshot | None:
        return self._by_name.get(name)


class ModelNeed(Protocol):
    """How much a model is wanted in the near future (DemandBoard's ModelDemand)."""

    @property
    def waiters(self) -> int: ...

    @property
    def intents(self) -> int: ...

    @property
    def recent_use(self) -> float: ...

    @property
    def prediction(self) -> float: ...

    @property
    def last_used_at(self) -> float | None: ...


class NeedView(Protocol):
    """A read-only view of the demand board: ``of(model)`` for every model."""

    def of(self, model: str) -> ModelNeed: ...


@dataclass(frozen=True, slots=True)
class Need:
    """A plain :class:`ModelNeed` value."""

    waiters: int = 0
    intents: int = 0
    recent_use: float = 0.0
    prediction: float = 0.0
    last_used_at: float | None = None


@dataclass(frozen=True, slots=True)
class NeedTable:
    """A :class:`NeedView` over a mapping; unknown models are not needed at all."""

    needs: Mapping[str, Need] = field(default_factory=dict)

    def of(self, model: str) -> ModelNeed:
        return self.needs.get(model, _NOT_NEEDED)


_NOT_NEEDED = Need()
