"""Turning decision records into the words users read: FailedScheduling and DEFER reasons.

Failure reasons stay data (gate results) until here, the edge, where they become one
message in kube-scheduler's shape:
``0/3 models are available for phase mulling: 3 didn't match require selector.``
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from kubemoot.api import SchedulingRule
from kubemoot.gates import DecisionRecord, GateResult
from kubemoot.scheduling.plugins import GATES

__all__ = [
    "count_message",
    "defer_reason",
    "defer_text",
    "failed_scheduling_message",
    "failure_phrase",
    "unschedulable_reason",
    "unschedulable_text",
]

_PHRASES = {
    "Require": "didn't match require selector",
    "ModelReady": "Model not ready",
    "ProviderReady": "provider not ready",
    "Freshness": "provider status stale",
    "VRAM": "insufficient VRAM",
    "Parallelism": "provider at its agent limit",
    "License": "license not ALLOW",
    "Egress": "egress not permitted",
    "Runtime": "runtime version not met",
    "Digest": "digest quarantined or mismatched",
    "TopologySpread": "didn't satisfy topology spread",
}
_GATE_ORDER = {name: index for index, name in enumerate(GATES)}
_SHOWN = 5


def failure_phrase(result: GateResult) -> str:
    """The short phrase kube-scheduler would print for this failed gate."""
    if result.gate == "ProviderReady" and result.evidence.get("field") == "spec.providerRef":
        return "providerRef not found"
    return _PHRASES.get(result.gate, f"failed {result.gate}")


def count_message(phase: str, total: int, first_failures: Iterable[GateResult]) -> str:
    """``0/N models are available for phase P: k reason, …`` with reasons in gate order."""
    counts: Counter[str] = Counter()
    order: dict[str, int] = {}
    for first in first_failures:
        phrase = failure_phrase(first)
        counts[phrase] += 1
        order.setdefault(phrase, _GATE_ORDER.get(first.gate, len(_GATE_ORDER)))
    head = f"0/{total} models are available for phase {phase}"
    if not counts:
        return head + "."
    parts = [f"{counts[phrase]} {phrase}" for phrase in sorted(counts, key=order.__getitem__)]
    return f"{head}: {', '.join(parts)}."


def failed_scheduling_message(record: DecisionRecord, phase: str) -> str:
    """The message of a FailedScheduling event for an UNSCHEDULABLE record."""
    return count_message(phase, len(record.candidates), _first_failures(record))


def _first_failures(record: DecisionRecord) -> list[GateResult]:
    firsts = (record.candidates[cid].failures for cid in record.hard_failed)
    return [failures[0] for failures in firsts if failures]


def unschedulable_text(
    phase: str, total: int, first_failures: Sequence[GateResult], rule: SchedulingRule | None
) -> str:
    """lastUnschedulable.reason: the selector when nothing matched it, else the counts."""
    if total == 0:
        return f"no Models exist to schedule phase {phase}"
    if rule is not None and first_failures and all(f.gate == "Require" for f in first_failures):
        selector = "{}" if rule.require is None else rule.require.describe()
        return f"no Model matches require selectors {selector}"
    return count_message(phase, total, first_failures)


def unschedulable_reason(record: DecisionRecord, phase: str, rule: SchedulingRule | None) -> str:
    """:func:`unschedulable_text` of a record."""
    return unschedulable_text(phase, len(record.candidates), _first_failures(record), rule)


def defer_text(waits: Iterable[tuple[str, Iterable[GateResult]]]) -> str:
    """Name the UNKNOWN or STALE evidence each uncertain candidate waits on (never "no
    match"); ``waits`` pairs candidate ids (sorted) with their unresolved gate results."""
    lines = [
        f"{cid}: {result.gate} {result.result.value} ({result.reason})"
        for cid, results in waits
        for result in results
    ]
    shown = "; ".join(lines[:_SHOWN])
    more = len(lines) - _SHOWN
    return "deferred, waiting on evidence: " + shown + (f"; and {more} more" if more > 0 else "")


def defer_reason(record: DecisionRecord) -> str:
    """:func:`defer_text` of a DEFER record."""
    return defer_text((cid, record.candidates[cid].unresolved) for cid in record.uncertain)
