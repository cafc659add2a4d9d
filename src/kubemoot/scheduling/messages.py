"""Turning decision records into the words users read: FailedScheduling and DEFER reasons.

Failure reasons stay data (gate results) until here, the edge, where they become one
message in kube-scheduler's shape:
``0/3 models are available for phase mulling: 3 didn't match require selector.``
"""

from __future__ import annotations

from collections import Counter

from kubemoot.api import SchedulingRule
from kubemoot.gates import DecisionRecord, GateResult
from kubemoot.scheduling.plugins import GATES

__all__ = ["defer_reason", "failed_scheduling_message", "failure_phrase", "unschedulable_reason"]

_PHRASES = {
    "Require": "didn't match require selector",
    "ModelReady": "Model not ready",
    "ProviderReady": "provider not ready",
    "Freshness": "provider status stale",
    "VRAM": "insufficient VRAM",
    "Parallelism": "provider at its agent limit",
    "License": "license not ALLOW",
    "Egress": "egress not permitted",
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


def failed_scheduling_message(record: DecisionRecord, phase: str) -> str:
    """Counts per first failing gate, in gate order (the message of a FailedScheduling event)."""
    counts: Counter[str] = Counter()
    order: dict[str, int] = {}
    for cid in record.hard_failed:
        failures = record.candidates[cid].failures
        if not failures:
            continue
        first = failures[0]
        phrase = failure_phrase(first)
        counts[phrase] += 1
        order.setdefault(phrase, _GATE_ORDER.get(first.gate, len(_GATE_ORDER)))
    head = f"0/{len(record.candidates)} models are available for phase {phase}"
    if not counts:
        return head + "."
    parts = [f"{counts[phrase]} {phrase}" for phrase in sorted(counts, key=order.__getitem__)]
    return f"{head}: {', '.join(parts)}."


def unschedulable_reason(record: DecisionRecord, phase: str, rule: SchedulingRule | None) -> str:
    """lastUnschedulable.reason: the selector when nothing matched it, else the counts."""
    failed = [record.candidates[cid].failures for cid in record.hard_failed]
    if failed and all(f and f[0].gate == "Require" for f in failed) and rule is not None:
        selector = "{}" if rule.require is None else rule.require.describe()
        return f"no Model matches require selectors {selector}"
    if not record.candidates:
        return f"no Models exist to schedule phase {phase}"
    return failed_scheduling_message(record, phase)


def defer_reason(record: DecisionRecord) -> str:
    """Name the UNKNOWN or STALE evidence the phase waits on (never "no match")."""
    waits: list[str] = []
    for cid in record.uncertain:
        for result in record.candidates[cid].unresolved:
            waits.append(f"{cid}: {result.gate} {result.result.value} ({result.reason})")
    shown = "; ".join(waits[:_SHOWN])
    more = len(waits) - _SHOWN
    return "deferred, waiting on evidence: " + shown + (f"; and {more} more" if more > 0 else "")
