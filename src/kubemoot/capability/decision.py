"""Decide one PlacementRequest: gates, scores, outcome and the PlacementDecision document."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from kubemoot.api.errors import InputError
from kubemoot.capability.gates import (
    GATE_FIELDS,
    NodeCandidate,
    capability_gates,
    rfc3339,
)
from kubemoot.capability.model import API_VERSION, KIND, PlacementRequest
from kubemoot.capability.scoring import SCORING_POLICY_VERSION, scoring_policy
from kubemoot.gates import DecisionRecord, Outcome, Verdict, evaluate, jsonable

__all__ = ["DECISION_KIND", "SCHEDULER_VERSION", "decide", "decision_document"]

SCHEDULER_VERSION = "kubemoot-capability-scheduler/v1"
DECISION_KIND = "PlacementDecision"


def decide(request: PlacementRequest, *, now: datetime | None = None) -> DecisionRecord:
    """Evaluate every node of ``request`` and return the decision record.

    The decision time is ``spec.now``; ``now`` is used only when the request has none
    (the CLI passes the current time). Nodes are candidates with their names as ids.
    """
    moment = _decision_time(request, now)
    spec = request.spec
    limit = spec.freshness.max_age_seconds
    candidates = [NodeCandidate.at(n, now=moment, max_age_seconds=limit) for n in spec.nodes]
    record = evaluate(
        candidates,
        key=lambda c: c.name,
        gates=capability_gates(spec.workload),
        scorers=scoring_policy(spec.workload),
        subject=spec.workload.id,
        scheduler_version=SCHEDULER_VERSION,
        scoring_policy_version=SCORING_POLICY_VERSION,
    )
    by_name = {c.name: c for c in candidates}
    return _explained(record, by_name)


def decision_document(
    request: PlacementRequest, record: DecisionRecord, *, now: datetime | None = None
) -> dict[str, Any]:
    """The ``PlacementDecision`` document (JSON-ready, camelCase)."""
    base = record.to_dict()
    spec = request.spec
    workload = spec.workload
    return {
        "apiVersion": API_VERSION,
        "kind": DECISION_KIND,
        "metadata": {"name": request.metadata.name},
        "recordVersion": record.record_version,
        "workloadId": workload.id,
        "outcome": record.outcome.value,
        "node": record.chosen,
        "feasible": base["feasible"],
        "uncertain": base["uncertain"],
        "hardFailed": base["hardFailed"],
        "gates": base["gates"],
        "scores": base["scores"],
        "scoreBreakdown": base["scoreBreakdown"],
        "weights": base["weights"],
        "ranked": base["ranked"],
        "schedulerVersion": record.scheduler_version,
        "scoringPolicyVersion": record.scoring_policy_version,
        "reason": record.reason,
        "recheckTriggers": base["recheckTriggers"],
        "now": rfc3339(_decision_time(request, now)),
        "freshness": {"maxAgeSeconds": spec.freshness.max_age_seconds},
        "contract": jsonable(workload.model_dump(by_alias=True, exclude_none=True)),
        # The authority the license and policy gates relied on (null: none was named).
        "authority": None if spec.authority is None else spec.authority.model_dump(),
    }


def _decision_time(request: PlacementRequest, now: datetime | None) -> datetime:
    moment = request.spec.now or now
    if moment is None:
        raise InputError(
            "the request has no spec.now and no decision time was given",
            kind=KIND,
            name=request.metadata.name,
            field="spec.now",
        )
    return moment


def _explained(record: DecisionRecord, nodes: dict[str, NodeCandidate]) -> DecisionRecord:
    """Rewrite reason and recheck triggers in the capability spec's terms."""
    return replace(record, reason=_reason(record), recheck_triggers=_triggers(record, nodes))


def _why_failed(record: DecisionRecord, name: str) -> str:
    failures = record.candidates[name].failures
    return f"{name} fails " + "; ".join(f"{g.gate} ({g.reason})" for g in failures)


def _why_uncertain(record: DecisionRecord, name: str) -> str:
    unresolved = record.candidates[name].unresolved
    stale = [g for g in unresolved if g.result is Verdict.STALE]
    unknown = [GATE_FIELDS.get(g.gate, g.gate) for g in unresolved if g.result is Verdict.UNKNOWN]
    parts = []
    if stale:
        freshness = record.candidates[name].gate("freshness")
        parts.append(f"{name}'s evidence is stale ({freshness.reason if freshness else 'old'})")
    if unknown:
        parts.append(f"{name} declares no {', '.join(unknown)}")
    return "; ".join(parts)


def _reason(record: DecisionRecord) -> str:
    parts: list[str] = []
    if record.outcome is Outcome.PLACE:
        chosen = record.chosen
        assert chosen is not None
        text = (
            f"PLACE on {chosen}: it passes every hard gate and has the highest score "
            f"({record.scores[chosen]:.2f})"
        )
        if len(record.ranked) > 1:
            runner_up = record.ranked[1]
            text += f" of {len(record.ranked)} feasible (next: {runner_up}, "
            text += f"{record.scores[runner_up]:.2f})"
        parts.append(text)
    elif record.outcome is Outcome.DEFER:
        parts.append(
            "DEFER: no node passes every hard gate now, but "
            + ", ".join(record.uncertain)
            + " could once missing or stale evidence is resolved"
        )
    elif not record.candidates:
        parts.append("UNSCHEDULABLE: the request lists no nodes")
    else:
        parts.append("UNSCHEDULABLE: every node fails a hard gate on known, fresh evidence")
    parts.extend(_why_uncertain(record, n) for n in record.uncertain)
    parts.extend(_why_failed(record, n) for n in record.hard_failed)
    return "; ".join(parts)


def _triggers(record: DecisionRecord, nodes: dict[str, NodeCandidate]) -> tuple[str, ...]:
    triggers: list[str] = []
    for name in record.uncertain:
        candidate = nodes[name]
        unresolved = record.candidates[name].unresolved
        if any(g.result is Verdict.STALE for g in unresolved):
            age = candidate.age_seconds or 0.0
            triggers.append(
                f"refresh of {name}'s capability evidence (observed {candidate.observed_at}, "
                f"{age:.0f} s old, max {candidate.max_age_seconds:g} s)"
            )
        for result in unresolved:
            if result.result is Verdict.UNKNOWN:
                triggers.append(
                    f"{name} publishes {GATE_FIELDS.get(result.gate, result.gate)} "
                    f"(the {result.gate} gate is UNKNOWN)"
                )
    for name in record.hard_failed:
        for result in record.candidates[name].failures:
            triggers.append(
                f"{name}'s {result.gate} evidence changes so that it no longer "
                f"fails: {result.reason}"
            )
    chosen = record.chosen
    if chosen is not None:
        candidate = nodes[chosen]
        if candidate.node.observed_at is not None:
            expires = candidate.node.observed_at + timedelta(seconds=candidate.max_age_seconds)
            triggers.append(
                f"{chosen}'s evidence turns STALE at {rfc3339(expires)} unless refreshed"
            )
        triggers.append(f"any change of {chosen}'s capability evidence or telemetry")
    return tuple(triggers)
