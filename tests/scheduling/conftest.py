"""Shared helpers for the scheduling tests."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from kubemoot.api import (
    Agent,
    CrewSchedulingPolicy,
    KubemootConfig,
    Model,
    ModelProvider,
    MootArchetype,
    SchedulingRule,
)
from kubemoot.gates import Outcome
from kubemoot.scheduling import ClusterSnapshot, ScheduleResult, schedule_bundle
from kubemoot.scheduling.messages import (
    defer_reason,
    failed_scheduling_message,
    unschedulable_reason,
)

NOW = datetime(2026, 5, 15, 12, 0, tzinfo=UTC)


def run(
    *,
    models: Iterable[Model] = (),
    providers: Iterable[ModelProvider] = (),
    agents: Iterable[Agent] = (),
    policies: Iterable[CrewSchedulingPolicy] = (),
    archetypes: Iterable[MootArchetype] = (),
    config: KubemootConfig | None = None,
    now: datetime = NOW,
) -> ScheduleResult:
    """One scheduling pass over the given resources."""
    snapshot = ClusterSnapshot.build(
        models=models,
        providers=providers,
        agents=agents,
        policies=policies,
        archetypes=archetypes,
        config=config,
    )
    return schedule_bundle(snapshot, now=now)


def assert_phases_agree_with_their_records(result: ScheduleResult) -> None:
    """Every phase's outcome, binding and reason are what its decision record says."""
    for scheduled in result.agents:
        for phase in scheduled.phases.values():
            record = phase.decision
            assert record.outcome is phase.outcome, (scheduled.name, phase.phase)
            if phase.outcome is Outcome.PLACE:
                assert record.chosen == phase.model
                assert record.scores[record.chosen] == phase.score
                # a bound model is listed first among the candidates
                assert phase.candidates[0][0] == phase.model_id
            else:
                assert phase.placement is None
            if phase.outcome is Outcome.DEFER:
                assert phase.reason == defer_reason(record)
            if phase.outcome is Outcome.UNSCHEDULABLE:
                table_rule = scheduled.policy and scheduled.policy.spec.rule_for(phase.phase)
                assert phase.reason == unschedulable_reason(
                    record, phase.phase, table_rule or SchedulingRule(phase=phase.phase)
                )
                assert phase.failure_message == failed_scheduling_message(record, phase.phase)
