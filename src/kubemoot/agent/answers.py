"""The crew's answer when its agents could not get a GPU.

When a discussion settles with no ``agree`` and no ``concern`` but some agent stood
aside for capacity (or is still waiting for it), the coordinator does not call a model
to synthesise nothing: it tells the user plainly that the cluster, not the crew, was
the limit, and what would help. The sentences are the spec's, since users read them:

* gpu-busy / still waiting — every GPU was busy with other work; try again shortly.
* model-too-large — names the model; add a smaller Model or a larger GPU.
* prompt-too-large — no provider's context holds the prompt; raise a provider's
  OLLAMA_CONTEXT_LENGTH or send less.
* unschedulable — not capacity but the operator's verdict: the phase has no binding, so
  the agent made no call; the answer quotes each agent's FailedScheduling message.

Each reason that occurred contributes its sentence, in that order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kubemoot.agent.signals import Signal, SignalType, StandAsideReason

__all__ = ["CapacityRecord", "capacity_answer"]

# The spec prescribes these sentences word for word; only the model name is filled in.
GPU_BUSY_TEXT = (
    "The crew’s agents could not get a GPU: every GPU was busy with other work, so none "
    "of them could answer in time. This is the cluster’s capacity, not the crew’s "
    "design; ask again in a moment."
)
MODEL_TOO_LARGE_TEXT = (
    "No GPU in this cluster can hold the model {models} the agents need; add a smaller "
    "Model or a larger GPU."
)
PROMPT_TOO_LARGE_TEXT = (
    "No provider gives an acceptable model a context that holds the prompt. Raise the "
    "per-request context on a provider (OLLAMA_CONTEXT_LENGTH) or shorten what the crew "
    "sends."
)

# Not the spec's words: an unschedulable phase is the crew's placement, not a busy GPU.
UNSCHEDULABLE_TEXT = (
    "No model could be scheduled for the agents' phase, so they made no call: {reasons}. "
    "See the Agents' FailedScheduling events and status.scheduling."
)


@dataclass(slots=True)
class CapacityRecord:
    """What the coordinator noted about capacity during one discussion."""

    gpu_busy: bool = False
    too_large_models: list[str] = field(default_factory=list)
    prompt_too_large: bool = False
    unschedulable: list[str] = field(default_factory=list)  # "agent: FailedScheduling"

    @property
    def any(self) -> bool:
        return self.capacity or bool(self.unschedulable)

    def note(self, signal: Signal, *, still_waiting: bool = False) -> None:
        """Record a ``waiting`` or capacity ``stand_aside`` signal."""
        if signal.type is SignalType.WAITING and still_waiting:
            self.gpu_busy = True
        if signal.type is not SignalType.STAND_ASIDE:
            return
        reason = signal.metadata.reason
        if reason == StandAsideReason.GPU_BUSY:
            self.gpu_busy = True
        elif reason == StandAsideReason.MODEL_TOO_LARGE:
            model = signal.metadata.model or "(unnamed)"
            if model not in self.too_large_models:
                self.too_large_models.append(model)
        elif reason == StandAsideReason.PROMPT_TOO_LARGE:
            self.prompt_too_large = True
        elif reason == StandAsideReason.UNSCHEDULABLE:
            line = f"{signal.agent}: {signal.content}"
            if line not in self.unschedulable:
                self.unschedulable.append(line)

    @property
    def capacity(self) -> bool:
        """Whether a GPU, not the crew's scheduling, held an agent back."""
        return self.gpu_busy or bool(self.too_large_models) or self.prompt_too_large

    @classmethod
    def from_signals(
        cls, signals: Iterable[Signal], *, still_waiting: Iterable[str] = ()
    ) -> CapacityRecord:
        """Build the record from a thread's signals; ``still_waiting`` names agents
        whose last signal was ``waiting`` when the discussion settled."""
        record = cls()
        waiting = set(still_waiting)
        for signal in signals:
            record.note(signal, still_waiting=signal.agent in waiting)
        return record


def capacity_answer(record: CapacityRecord) -> str | None:
    """The coordinator's answer for a capacity-only outcome, or ``None`` when no
    capacity reason occurred (then the ordinary no-contribution text applies)."""
    parts: list[str] = []
    if record.gpu_busy:
        parts.append(GPU_BUSY_TEXT)
    if record.too_large_models:
        parts.append(MODEL_TOO_LARGE_TEXT.format(models=", ".join(record.too_large_models)))
    if record.prompt_too_large:
        parts.append(PROMPT_TOO_LARGE_TEXT)
    if record.unschedulable:
        parts.append(UNSCHEDULABLE_TEXT.format(reasons="; ".join(record.unschedulable)))
    return " ".join(parts) or None
