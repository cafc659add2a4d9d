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
)
from kubemoot.scheduling import ClusterSnapshot, ScheduleResult, schedule_bundle

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
