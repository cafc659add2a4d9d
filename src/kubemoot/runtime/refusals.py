"""Why a call found no option, as typed values that carry their facts.

Waiting only helps when the GPUs are busy. A model no card can hold, a prompt no
provider's context can take, a name nobody knows, memory nobody published or servers
that do not answer are reported at once, so the caller can say why instead of waiting
out its budget. Each refusal is a value with the numbers that prove it (kube-scheduler's
``InsufficientResource{requested, capacity}``); the edges turn it into words once — the
gateway into HTTP, the agent into a sentence — and never re-read the fleet to do it.

* :class:`ModelUnknown` — no acceptable model is known anywhere: no Model resource
  declares it, no provider lists it on disk, runs it, loads it or has ever reported its
  footprint. That is a misspelt name. Every provider must be ready to say so: a
  provider that is down lists nothing.
* :class:`ProviderDown` — no ready provider has an acceptable model (or could hold one
  it lists), and some providers that could are down: the model may well exist, its
  servers do not answer.
* :class:`StateStale` — as ProviderDown, but what stands in the way is providers whose
  published state is older than its freshness limit (:mod:`kubemoot.runtime.freshness`):
  nobody has looked at them lately, so they are not known to be down either. Waiting
  helps (a fresh probe wakes the call); a call that gives up says which states are how
  old.
* :class:`MemoryUnknown` — no copy exists, and the only providers that might load one
  never published their VRAM total: nothing can be priced, so nothing will ever be
  loaded there until ``vramMiB`` is given.
* :class:`ModelTooLarge` — every provider that published its VRAM total has usable <
  occupancy(preferred). An unknown total never proves a model too large.
* :class:`PromptTooLarge` — some provider could hold an acceptable model, but the
  context of every such (provider, model) pair is known and smaller than the prompt.
  An unknown context admits the prompt.
* otherwise :class:`GpuBusy` — the call waits for capacity; when it gives up, the
  refusal says how long it waited and when a start looks likely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from kubemoot.gates.results import Verdict
from kubemoot.runtime import filters
from kubemoot.runtime.cost import CostModel
from kubemoot.runtime.freshness import StaleState
from kubemoot.runtime.snapshot import FleetSnapshot, ProviderSnapshot

__all__ = [
    "GpuBusy",
    "MemoryUnknown",
    "ModelTooLarge",
    "ModelUnknown",
    "PromptTooLarge",
    "ProviderDown",
    "Reason",
    "Refusal",
    "StateStale",
    "classify",
]


class Reason(StrEnum):
    """The wire name of a refusal (``metadata.reason``, metric labels, JSON)."""

    GPU_BUSY = "gpu-busy"
    MODEL_TOO_LARGE = "model-too-large"
    PROMPT_TOO_LARGE = "prompt-too-large"
    MODEL_UNKNOWN = "model-unknown"
    MEMORY_UNKNOWN = "memory-unknown"
    PROVIDER_DOWN = "provider-down"
    STATE_STALE = "state-stale"
    # Not the runtime's: the operator found no Model for the phase and removed its
    # binding, so the agent made no call (its signal's content is the FailedScheduling
    # message). It travels in the same metadata.reason, so it has its wire name here.
    UNSCHEDULABLE = "unschedulable"


@dataclass(frozen=True, slots=True)
class ModelUnknown:
    """Nobody offers or declares ``name`` (the preferred model)."""

    name: str
    reason: ClassVar[Reason] = Reason.MODEL_UNKNOWN
    final: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class ProviderDown:
    """The providers that might have the model do not answer their probes."""

    providers: tuple[str, ...]
    reason: ClassVar[Reason] = Reason.PROVIDER_DOWN
    final: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class StateStale:
    """The providers that might run the model have states nobody refreshes: each one's
    ``lastProbedAt`` and freshness limit, by name; ``at``: when this was said (the
    ages are ``at − probed_at``)."""

    providers: tuple[str, ...]
    probed_at: tuple[float, ...]
    max_age_seconds: tuple[float, ...]
    at: float
    waited: float = 0.0
    reason: ClassVar[Reason] = Reason.STATE_STALE
    final: ClassVar[bool] = False

    def ages(self) -> tuple[float, ...]:
        return tuple(self.at - probed for probed in self.probed_at)


@dataclass(frozen=True, slots=True)
class MemoryUnknown:
    """A cold load is the only way, on providers whose VRAM total nobody published."""

    providers: tuple[str, ...]
    reason: ClassVar[Reason] = Reason.MEMORY_UNKNOWN
    final: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class ModelTooLarge:
    """``need_mib`` (the model's occupancy) exceeds every known usable memory."""

    need_mib: int | None
    largest_usable_mib: int | None
    largest_provider: str | None = None
    reason: ClassVar[Reason] = Reason.MODEL_TOO_LARGE
    final: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class PromptTooLarge:
    """The prompt (``tokens``, estimated) outgrows every context that could run it."""

    tokens: int
    largest_context: int | None
    reason: ClassVar[Reason] = Reason.PROMPT_TOO_LARGE
    final: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class GpuBusy:
    """No room now. ``waited``: seconds the call waited before giving up;
    ``start_estimate``: seconds until a start looks likely (None: nothing says)."""

    waited: float = 0.0
    start_estimate: float | None = None
    reason: ClassVar[Reason] = Reason.GPU_BUSY
    final: ClassVar[bool] = False


Refusal = (ModelUnknown | ProviderDown | StateStale | MemoryUnknown | ModelTooLarge
           | PromptTooLarge | GpuBusy)
"""Every reason a call was not placed; ``final`` says whether waiting cannot help."""


def classify(
    fleet: FleetSnapshot,
    cost: CostModel,
    *,
    preferred: str,
    acceptable: Sequence[str],
    prompt_tokens: int | None,
) -> Refusal:
    """Classify a placement that came back empty, with the facts that prove it."""
    if all(model_unknown(fleet, cost, model) for model in acceptable):
        return ModelUnknown(preferred)
    down = providers_down(fleet, acceptable, cost)
    stale = [p.state for p in fleet.providers
             if p.name in down and isinstance(p.state, StaleState)]
    if stale:  # not known to be down: what they say is too old to place on
        return StateStale(
            tuple(s.provider for s in stale), tuple(s.last_probed_at or 0.0 for s in stale),
            tuple(s.max_age_seconds for s in stale), fleet.now)
    if down:
        return ProviderDown(down)
    unknown = memory_unknown(fleet, cost, acceptable)
    if unknown:
        return MemoryUnknown(unknown)
    if model_too_large(fleet, cost, preferred):
        usable, card = _largest_usable(fleet)
        return ModelTooLarge(cost.occupancy(preferred), usable, card)
    if prompt_tokens is not None and prompt_too_large(fleet, cost, acceptable, prompt_tokens):
        return PromptTooLarge(prompt_tokens, largest_context(fleet, acceptable))
    return GpuBusy()


def model_unknown(fleet: FleetSnapshot, cost: CostModel, model: str) -> bool:
    """Whether nothing in the fleet or the declarations knows ``model`` at all."""
    if not fleet.providers or any(not p.state.ready for p in fleet.providers):
        return False  # no answer from some provider: it might hold the model
    if cost.occupancy(model) is not None:
        return False  # declared, observed, claimed or listed on some provider's disk
    return not any(p.has_copy(model) for p in fleet.providers)


def _might_have(p: ProviderSnapshot, models: Sequence[str]) -> bool:
    """Whether a ready provider has (or, listing nothing, might have) one of ``models``."""
    listed = p.state.disk_sizes_mib
    return (not listed or any(m in listed for m in models)
            or any(p.has_copy(m) for m in models))


def providers_down(
    fleet: FleetSnapshot, acceptable: Sequence[str], cost: CostModel | None = None
) -> tuple[str, ...]:
    """The down providers, when no ready one has an acceptable model (else empty).

    With ``cost``, a ready provider that lists a model on its disk but whose card could
    never hold it does not count: an Ollama server lists every model it has pulled, so
    a small card listing a large model would otherwise make the call wait out its whole
    budget for a card that is down, and be told that the GPUs are busy."""
    down = tuple(sorted(
        p.name for p in fleet.providers if not p.state.ready
        # a down card too small for every acceptable model could not run it either
        and (cost is None or any(_could_hold(p, cost, m) for m in acceptable))))
    if not down:
        return ()
    for p in fleet.providers:
        if not p.state.ready or not _might_have(p, acceptable):
            continue
        if cost is None or any(_could_hold(p, cost, m) for m in acceptable):
            return ()
    return down


def memory_unknown(
    fleet: FleetSnapshot, cost: CostModel, acceptable: Sequence[str]
) -> tuple[str, ...]:
    """The ready providers of unknown VRAM total, when only a cold load there could
    run the call: no copy of an acceptable model exists on a ready provider, and no
    provider with a known total could ever hold one. Empty otherwise."""
    ready = [p for p in fleet.providers if p.state.ready]
    if any(p.has_copy(m) for p in ready for m in acceptable):
        return ()
    if any(p.state.provisional and p.usable_mib is None for p in ready):
        # an agent's direct probe stands in for the operator: the total is not known
        # yet, and the operator's state (which the waiter wakes on) will say it
        return ()
    unknown = tuple(sorted(p.name for p in ready if p.usable_mib is None))
    if not unknown:
        return ()
    for p in ready:
        usable = p.usable_mib
        if usable is None:
            continue
        for model in acceptable:
            need = cost.occupancy(model)
            if need is None or need <= usable:
                return ()  # a known card could hold it: that is busy, not unknown
    return unknown


def model_too_large(fleet: FleetSnapshot, cost: CostModel, model: str) -> bool:
    occupancy = cost.occupancy(model)
    if occupancy is None or not fleet.providers:
        return False  # nothing proves it: we cannot tell too large from busy
    for p in fleet.providers:
        usable = p.usable_mib
        if usable is None or usable >= occupancy:
            return False
    return True


def _largest_usable(fleet: FleetSnapshot) -> tuple[int | None, str | None]:
    cards = [(p.usable_mib, p.name) for p in fleet.providers if p.usable_mib is not None]
    if not cards:
        return None, None
    usable, card = min(cards, key=lambda c: (-c[0], c[1]))  # ties: by name
    return usable, card


def largest_context(fleet: FleetSnapshot, models: Sequence[str]) -> int | None:
    """The largest context any provider offers for any of ``models`` (None: unknown)."""
    contexts = [c for p in fleet.providers for m in models
                if (c := p.context_for(m)) is not None]
    return max(contexts) if contexts else None


def _could_hold(p: ProviderSnapshot, cost: CostModel, model: str) -> bool:
    if p.is_resident(model) or p.loading_tickets(model):
        return True
    usable, occupancy = p.usable_mib, cost.occupancy(model)
    return usable is None or occupancy is None or occupancy <= usable


def prompt_too_large(
    fleet: FleetSnapshot, cost: CostModel, acceptable: Sequence[str], prompt_tokens: int
) -> bool:
    some_could_hold = False
    for model in acceptable:
        for p in fleet.providers:
            if not _could_hold(p, cost, model):
                continue
            some_could_hold = True
            if filters.context_gate(p, model, prompt_tokens).result is not Verdict.FAIL:
                return False
    return some_could_hold
