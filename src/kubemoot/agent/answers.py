"""The crew's answer when its agents could not get a GPU.

When a discussion settles with no ``agree`` and no ``concern`` but some agent stood
aside for capacity (or is still waiting for it), the coordinator does not call a model
to synthesise nothing: it tells the user plainly that the cluster, not the crew, was
the limit, and what would help. The sentences are the spec's, since users read them:

* gpu-busy / still waiting — every GPU was busy with other work; try again shortly.
* model-too-large — names the model; add a smaller Model or a larger GPU.
* prompt-too-large — no provider's context holds the prompt; raise a provider's
  OLLAMA_CONTEXT_LENGTH or send less.
* provider-down — the servers that have the model do not answer; try again when they do.
* state-stale — the published state of the servers that have the model is too old
  (nobody probes them any more); try again once their prober is back.
* memory-unknown — only providers whose VRAM total nobody gave could load the model;
  give them ``vramMiB``.
* unschedulable — not capacity but the operator's verdict: the phase has no binding, so
  the agent made no call; the answer quotes each agent's FailedScheduling message.

The reason travels as its wire name in ``metadata.reason``; it is read back into the
runtime's :class:`~kubemoot.runtime.refusals.Reason` once, never compared as text.

Each reason that occurred contributes its sentence, in that order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kubemoot.agent.signals import Signal, SignalType
from kubemoot.runtime.refusals import Reason

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
PROVIDER_DOWN_TEXT = (
    "The servers that have the model {models} do not answer now; the model is not "
    "missing. Ask again once they are back."
)
# Not the spec's words: the spec has no freshness limit on the runtime's states.
STATE_STALE_TEXT = (
    "Nobody has probed the servers that have the model {models} lately, so the "
    "scheduler cannot tell whether they are up; it places nothing on them. Ask again "
    "once their prober (the operator or gateway serving them) runs again."
)
MEMORY_UNKNOWN_TEXT = (
    "The model {models} could only be loaded on providers whose GPU memory nobody "
    "gave; set vramMiB on those ModelProviders so that loads can be placed."
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
    down_models: list[str] = field(default_factory=list)
    stale_models: list[str] = field(default_factory=list)
    memory_unknown_models: list[str] = field(default_factory=list)
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
        reason = _reason(signal.metadata.reason)
        model = signal.metadata.model or "(unnamed)"
        if reason is Reason.GPU_BUSY:
            self.gpu_busy = True
        elif reason is Reason.MODEL_TOO_LARGE:
            _add(self.too_large_models, model)
        elif reason is Reason.PROMPT_TOO_LARGE:
            self.prompt_too_large = True
        elif reason is Reason.PROVIDER_DOWN:
            _add(self.down_models, model)
        elif reason is Reason.STATE_STALE:
            _add(self.stale_models, model)
        elif reason is Reason.MEMORY_UNKNOWN:
            _add(self.memory_unknown_models, model)
        elif reason is Reason.UNSCHEDULABLE:
            _add(self.unschedulable, f"{signal.agent}: {signal.content}")

    @property
    def capacity(self) -> bool:
        """Whether a GPU, not the crew's scheduling, held an agent back."""
        return (self.gpu_busy or bool(self.too_large_models) or self.prompt_too_large
                or bool(self.down_models) or bool(self.stale_models)
                or bool(self.memory_unknown_models))

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
    if record.down_models:
        parts.append(PROVIDER_DOWN_TEXT.format(models=", ".join(record.down_models)))
    if record.stale_models:
        parts.append(STATE_STALE_TEXT.format(models=", ".join(record.stale_models)))
    if record.memory_unknown_models:
        parts.append(MEMORY_UNKNOWN_TEXT.format(
            models=", ".join(record.memory_unknown_models)))
    if record.unschedulable:
        parts.append(UNSCHEDULABLE_TEXT.format(reasons="; ".join(record.unschedulable)))
    return " ".join(parts) or None


def _reason(wire: str | None) -> Reason | None:
    """The refusal a signal names, or None (no reason, or one this build does not know)."""
    try:
        return Reason(wire) if wire is not None else None
    except ValueError:
        return None


def _add(models: list[str], model: str) -> None:
    if model not in models:
        models.append(model)
