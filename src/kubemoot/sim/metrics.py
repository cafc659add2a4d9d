"""What a run measured, and how it is summarised.

The :class:`Recorder` receives every call outcome and every engine event of one run
(one policy on one trace) and turns them into a :class:`PolicyReport`: per-call wait
(issue → start of inference) and end-to-end latency percentiles, discussion makespan,
cold loads, evictions, GiB loaded, GPU busy share, stand-asides and refusals by reason,
and failures. It also keeps the time series the plots draw.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubemoot.frozen import quick_init
from kubemoot.sim.gpu import GpuEvents
from kubemoot.sim.phases import SOURCES, WaitPhases, WaitSource

__all__ = ["PolicyReport", "Recorder", "SimulatedOutcome", "percentile"]

FINISHED = "finished"
STOOD_ASIDE = "stood-aside"
REFUSED = "refused"
FAILED = "failed"


@quick_init
@dataclass(frozen=True, slots=True)
class SimulatedOutcome:
    """How one call ended. ``started``/``finished`` are virtual seconds from the start."""

    status: str  # finished | stood-aside | refused | failed
    provider: str | None = None
    model: str | None = None
    started: float | None = None
    reason: str | None = None
    evicted: tuple[str, ...] = ()


@dataclass(slots=True)
class _CallRecord:
    call_id: int
    discussion_id: int
    issued: float
    ended: float
    outcome: SimulatedOutcome
    phases: WaitPhases | None = None


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _r(value: float) -> float:
    return round(value, 3)


@dataclass(slots=True)
class Recorder(GpuEvents):
    """Collects one run's events (it is also the engines' event sink)."""

    sample_providers: tuple[str, ...] = ()
    calls: list[_CallRecord] = field(default_factory=list)
    loads: list[tuple[float, str, str, int]] = field(default_factory=list)
    unloads: list[tuple[float, str, str, str]] = field(default_factory=list)
    vram_samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    discussion_end: dict[int, float] = field(default_factory=dict)

    def load_started(self, gpu: str, model: str, mib: int, at: float) -> None:
        self.loads.append((at, gpu, model, mib))

    def unloaded(self, gpu: str, model: str, reason: str, at: float) -> None:
        self.unloads.append((at, gpu, model, reason))

    def call_started(self, gpu: str, model: str, at: float) -> None:
        """Start times come back with the outcome; nothing to keep here."""

    def call_ended(
        self, *, call_id: int, discussion_id: int, issued: float, ended: float,
        outcome: SimulatedOutcome, phases: WaitPhases | None = None,
    ) -> None:
        self.calls.append(_CallRecord(call_id, discussion_id, issued, ended, outcome, phases))

    def waits_by_call(self) -> dict[int, tuple[float, dict[WaitSource, float]]]:
        """Finished calls: call id → (wait, the wait split by phase)."""
        result: dict[int, tuple[float, dict[WaitSource, float]]] = {}
        for c in self.calls:
            if c.outcome.status != FINISHED:
                continue
            wait = _wait(c)
            result[c.call_id] = (wait, _split(c, wait))
        return result

    def report(
        self, *, policy: str, discussions: dict[int, float], busy_seconds: float,
        gpu_count: int, end: float, vram_checks: int, wall_seconds: float,
        cpu_seconds: float = 0.0,
        by_call: dict[int, tuple[float, dict[WaitSource, float]]] | None = None,
    ) -> PolicyReport:
        finished = [c for c in self.calls if c.outcome.status == FINISHED]
        by_call = self.waits_by_call() if by_call is None else by_call
        waits = sorted(wait for wait, _parts in by_call.values())
        e2e = sorted(c.ended - c.issued for c in finished)
        last: dict[int, float] = {}
        for c in self.calls:
            last[c.discussion_id] = max(last.get(c.discussion_id, 0.0), c.ended)
        makespans = sorted(last[d] - discussions[d] for d in last)
        stood = Counter(c.outcome.reason or "unknown" for c in self.calls
                        if c.outcome.status == STOOD_ASIDE)
        refused = Counter(c.outcome.reason or "unknown" for c in self.calls
                          if c.outcome.status == REFUSED)
        evictions = sum(1 for u in self.unloads if u[3] in ("evicted", "unloaded"))
        parts = dict.fromkeys(SOURCES, 0.0)
        for _wait_seconds, split in by_call.values():
            for name, seconds in split.items():
                parts[name] += seconds
        return PolicyReport(
            policy=policy,
            calls=len(self.calls),
            finished=len(finished),
            wait=_summary(waits),
            e2e=_summary(e2e),
            makespan=_summary(makespans),
            cold_loads=len(self.loads),
            evictions=evictions,
            expirations=sum(1 for u in self.unloads if u[3] == "expired"),
            gib_loaded=_r(sum(load[3] for load in self.loads) / 1024),
            gpu_busy_percent=_r(100 * busy_seconds / (gpu_count * end)) if end > 0 else 0.0,
            stood_aside=dict(sorted(stood.items())),
            refused=dict(sorted(refused.items())),
            failures=sum(1 for c in self.calls if c.outcome.status == FAILED),
            vram_checks=vram_checks,
            wall_seconds=round(wall_seconds, 2),
            cpu_seconds=round(cpu_seconds, 2),
            waits=waits,
            wait_parts={k: _r(v / max(len(finished), 1)) for k, v in parts.items()},
        )


def _wait(call: _CallRecord) -> float:
    """Issue → first token (the start of inference plus the prefill, if any)."""
    return (call.outcome.started or call.issued) - call.issued


def _split(call: _CallRecord, wait: float) -> dict[WaitSource, float]:
    """The call's wait by phase; a call the engine never saw waited for memory."""
    if call.phases is not None and call.phases.started is not None:
        return call.phases.split()
    parts = dict.fromkeys(SOURCES, 0.0)
    parts[WaitSource.MEMORY] = wait
    return parts


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    return {
        "mean": _r(sum(values) / len(values)),
        "p50": _r(percentile(values, 50)),
        "p95": _r(percentile(values, 95)),
        "p99": _r(percentile(values, 99)),
        "max": _r(values[-1]),
    }


@dataclass(slots=True)
class PolicyReport:
    """One policy's figures on one trace."""

    policy: str
    calls: int
    finished: int
    wait: dict[str, float]
    e2e: dict[str, float]
    makespan: dict[str, float]
    cold_loads: int
    evictions: int
    expirations: int
    gib_loaded: float
    gpu_busy_percent: float
    stood_aside: dict[str, int]
    refused: dict[str, int]
    failures: int
    vram_checks: int
    wall_seconds: float
    cpu_seconds: float = 0.0  # this process's CPU time for the run (wall time drifts)
    waits: list[float] = field(repr=False, default_factory=list)
    ratio_to_lower_bound: float | None = None
    # mean seconds per finished call spent in each phase (sim.phases); they add up to
    # the mean wait
    wait_parts: dict[WaitSource, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "calls": self.calls,
            "finished": self.finished,
            "waitSeconds": self.wait,
            "meanWaitBySource": self.wait_parts,
            "e2eSeconds": self.e2e,
            "makespanSeconds": self.makespan,
            "coldLoads": self.cold_loads,
            "evictions": self.evictions,
            "expirations": self.expirations,
            "gibLoaded": self.gib_loaded,
            "gpuBusyPercent": self.gpu_busy_percent,
            "stoodAside": self.stood_aside,
            "refused": self.refused,
            "failures": self.failures,
            "vramChecks": self.vram_checks,
            "meanWaitRatioToLowerBound": self.ratio_to_lower_bound,
        }
