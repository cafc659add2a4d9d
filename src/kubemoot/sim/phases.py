"""Where one call's wait went: slot queueing, load, eviction, memory or prefill.

A call's wait runs from the moment it is issued to its first token: the start of
inference plus the prefill of what its slot's prompt cache did not hold. The
simulator splits it into five parts, measured on the emulated engine and by the policy:

* **eviction** — time the call spent while models were being unloaded for it: unloads
  a policy made before sending the call (the runtime's unload plans), and, while the
  call sat in the engine's own queue, time during which the card was unloading a model;
* **load** — time from the engine taking the call until its model was ready (its own
  load, or another call's load it joined), plus engine-queue time while the card was
  busy loading another model (Ollama loads one model at a time);
* **slot** — time waiting for one of the copy's parallel slots, in the engine's queue
  or, for a policy that queues calls itself (the runtime's *queue* answer), before a
  warm copy took it;
* **memory** — the rest: waiting for room on a card with nothing loading or unloading
  (the runtime's *wait* answer, or an engine queue stuck behind busy models);
* **prefill** — evaluating the part of the call's prompt that its engine slot did not
  hold in its prompt cache, before the first token (0 for a prompt with no blocks).

The five parts add up to the wait exactly. The record travels with the call through a
context variable, so neither the policies nor the runtime need a new parameter.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["CURRENT_CALL", "SOURCES", "CallComparison", "WaitPhases", "WaitSource", "compare_calls"]


class WaitSource(StrEnum):
    """The five parts a call's wait splits into (the module docstring), in report order."""

    SLOT = "slot"
    LOAD = "load"
    EVICTION = "eviction"
    MEMORY = "memory"
    PREFILL = "prefill"


#: The five, in order: iterating the enum class is slow (a generator of properties),
#: and every finished call's split starts from all of them.
SOURCES: tuple[WaitSource, ...] = tuple(WaitSource)

# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read under callgrind, a module global about
# 150): the members read once or more per call are kept at module level.
_SLOT, _LOAD, _EVICTION = WaitSource.SLOT, WaitSource.LOAD, WaitSource.EVICTION
_MEMORY, _PREFILL = WaitSource.MEMORY, WaitSource.PREFILL


@dataclass(slots=True)
class WaitPhases:
    """Timestamps and measured spans of one call (virtual seconds)."""

    issued: float
    engine_request: float | None = None  # the call reached the engine's queue
    engine_assigned: float | None = None  # the engine gave it a runner
    runner_ready: float | None = None  # that runner's model was ready
    started: float | None = None  # inference started (a slot was free)
    first_token: float | None = None  # the prompt was evaluated (prefill done)
    policy_evicting: float = 0.0  # unloads the policy waited for before sending
    queue_evicting: float = 0.0  # engine-queue time while the card was unloading
    queue_loading: float = 0.0  # engine-queue time while the card was loading another model
    joined_warm: bool = False  # the policy's wait ended on a warm copy (runtime queue answer)

    def split(self) -> dict[WaitSource, float]:
        """The wait in five parts that add up to ``first_token − issued`` (``started −
        issued`` when no prompt was evaluated)."""
        parts = dict.fromkeys(SOURCES, 0.0)
        if self.started is None or self.engine_request is None:
            return parts
        # Every call is split once: max(0.0, x) and min(a, b) are spelt out as the
        # builtins answer (x when x > 0.0, else 0.0; b when b < a, else a), without a call.
        before = self.engine_request - self.issued
        before = before if before > 0.0 else 0.0
        evicting = self.policy_evicting if self.policy_evicting < before else before
        parts[_EVICTION] += evicting
        # What a policy waited for before sending is a slot when it then took a warm
        # copy (it queued in its own line), otherwise memory.
        parts[_SLOT if self.joined_warm else _MEMORY] += before - evicting
        assigned = self.engine_assigned if self.engine_assigned is not None else self.engine_request
        queued = assigned - self.engine_request
        queued = queued if queued > 0.0 else 0.0
        in_queue_evict = self.queue_evicting if self.queue_evicting < queued else queued
        left = queued - in_queue_evict
        in_queue_load = self.queue_loading if self.queue_loading < left else left
        parts[_EVICTION] += in_queue_evict
        parts[_LOAD] += in_queue_load
        parts[_MEMORY] += queued - in_queue_evict - in_queue_load
        ready = self.runner_ready if self.runner_ready is not None else assigned
        loading = ready - assigned
        parts[_LOAD] += loading if loading > 0.0 else 0.0
        slot = self.started - ready
        parts[_SLOT] += slot if slot > 0.0 else 0.0
        if self.first_token is not None:
            prefill = self.first_token - self.started
            parts[_PREFILL] += prefill if prefill > 0.0 else 0.0
        return parts


CURRENT_CALL: contextvars.ContextVar[WaitPhases | None] = contextvars.ContextVar(
    "kubemoot_sim_current_call", default=None
)


@dataclass(frozen=True, slots=True)
class CallComparison:
    """The calls one policy made wait longer than another did, on the same trace."""

    calls: int  # calls both policies finished
    worse: int  # calls that waited more than ``margin`` seconds longer under ``ours``
    extra_seconds: float  # the sum of those calls' extra wait
    by_source: dict[WaitSource, float]  # our wait of those calls, by source

    def to_json(self) -> dict[str, object]:
        return {"calls": self.calls, "worse": self.worse,
                "extraSeconds": round(self.extra_seconds, 3),
                "bySource": {k: round(v, 3) for k, v in self.by_source.items()}}


def compare_calls(
    ours: dict[int, tuple[float, dict[WaitSource, float]]],
    theirs: dict[int, tuple[float, dict[WaitSource, float]]],
    *, margin: float = 1.0,
) -> CallComparison:
    """Which calls ``ours`` made wait (by more than ``margin`` s) that ``theirs`` did not."""
    both = ours.keys() & theirs.keys()
    worse = 0
    extra = 0.0
    by_source = dict.fromkeys(WaitSource, 0.0)
    for call in both:
        wait, parts = ours[call]
        delta = wait - theirs[call][0]
        if delta > margin:
            worse += 1
            extra += delta
            for name, seconds in parts.items():
                by_source[name] += seconds
    return CallComparison(len(both), worse, extra, by_source)
