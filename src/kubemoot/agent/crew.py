"""A crew for the runtime, from what the control plane bound.

The control plane publishes, per Agent and phase, a bound (model, provider, endpoint)
and a ranked candidate list. The agent runtime needs exactly that: the mulling list for
per-call placement, the bound triage model, and the bound endpoints as the static
fallback of calls that cannot wait. :func:`profiles_from_schedule` turns a scheduling
result into :class:`~kubemoot.agent.discussion.AgentProfile` values; ``endpoints``
rewrites providers' endpoints when the engines run somewhere else (the demo's emulators
listen on free ports).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubemoot.agent.discussion import AgentProfile
from kubemoot.agent.runtime import StaticTarget
from kubemoot.agent.toolloop import Tool
from kubemoot.api import ModelProvider, Phase
from kubemoot.runtime.placement import CandidateModel
from kubemoot.scheduling import PhaseResult, ScheduleResult

__all__ = ["COORDINATOR_ROLE", "profiles_from_schedule"]

COORDINATOR_ROLE = "coordinator"


def _static(
    phase: PhaseResult | None,
    providers: Mapping[str, ModelProvider],
    endpoints: Mapping[str, str],
) -> StaticTarget | None:
    if phase is None or phase.provider is None or phase.model_id is None:
        return None
    provider = providers.get(phase.provider)
    endpoint = endpoints.get(phase.provider) or phase.endpoint
    if endpoint is None:
        return None
    context = None if provider is None else provider.spec.context_length
    return StaticTarget(phase.provider, endpoint, phase.model_id, context)


def _candidates(phase: PhaseResult | None) -> tuple[CandidateModel, ...]:
    if phase is None:
        return ()
    listed = tuple(CandidateModel(model, score) for model, score in phase.candidates)
    if phase.model_id is not None and (not listed or listed[0].model != phase.model_id):
        # the bound model leads the list; keep it first even if a list came without it
        listed = (CandidateModel(phase.model_id, phase.score or 0.0),
                  *(c for c in listed if c.model != phase.model_id))
    return listed


def profiles_from_schedule(
    result: ScheduleResult,
    providers: Sequence[ModelProvider],
    *,
    endpoints: Mapping[str, str] | None = None,
    tools: Mapping[str, Sequence[Tool]] | None = None,
) -> list[AgentProfile]:
    """One profile per scheduled Agent that has a mulling binding or candidates.

    ``tools`` maps an Agent's name to the tools it may call.
    """
    by_name = {p.metadata.name: p for p in providers}
    endpoints = endpoints or {}
    tools = tools or {}
    profiles: list[AgentProfile] = []
    for agent in result.agents:
        mulling = agent.phases.get(Phase.MULLING)
        triage = agent.phases.get(Phase.TRIAGE)
        candidates = _candidates(mulling)
        if not candidates:
            continue  # unschedulable for mulling: FailedScheduling says why
        bound_triage = _static(triage, by_name, endpoints)
        role = agent.agent.spec.discuss_role or "member"
        profiles.append(AgentProfile(
            id=f"{agent.namespace}/{agent.name}",
            role=role,
            mulling=candidates,
            triage=(CandidateModel(bound_triage.model),) if bound_triage is not None else (),
            mulling_static=_static(mulling, by_name, endpoints),
            triage_static=bound_triage,
            system_prompt=f"You are {agent.name}, a {role} in an engineering crew.",
            tools=tuple(tools.get(agent.name, ())),
        ))
    return profiles
