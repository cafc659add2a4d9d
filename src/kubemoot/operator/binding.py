"""Writing a scheduling result: Agent status, Deployment env, FailedScheduling events.

The scheduling library decides (:mod:`kubemoot.scheduling`); this module applies its
:class:`~kubemoot.scheduling.result.AgentResult` to the cluster, writing only the
difference from what the cluster already holds. Repeated identical results are free:
no status patch, no Deployment patch, no event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from kubemoot.api import Agent
from kubemoot.gates import DecisionRecord, Outcome
from kubemoot.operator.deployment import deployment_name, env_patch, spec_env
from kubemoot.operator.events import EventRecorder, ObjectRef
from kubemoot.operator.kube import (
    KubeClient,
    KubeConflict,
    KubeError,
    custom_path,
    deployment_path,
)
from kubemoot.operator.status import condition, find_condition, merge_conditions, merge_patch
from kubemoot.scheduling.messages import failed_scheduling_message
from kubemoot.scheduling.plugins import TopologySpreadGate
from kubemoot.scheduling.result import AgentResult, policy_version
from kubemoot.scheduling.scheduler import PolicyPlan

__all__ = ["AgentWriter", "policy_conditions", "status_binding_holds", "still_feasible"]

_SHOWN = 5


def _dump(items: Iterable[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in items]


def _status(agent: Agent) -> dict[str, Any]:
    status = agent.to_manifest().get("status")
    return dict(status) if isinstance(status, Mapping) else {}


def _same(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    keys = ("status", "reason", "message")
    if old is None or new is None:
        return old is new
    return all(old.get(key) == new.get(key) for key in keys)


def _admits(model: str, record: DecisionRecord) -> bool:
    """Whether the bound ``model`` may stay, judged by a fresh decision ``record``."""
    if model in record.feasible:
        return True
    # Topology spread relates an Agent's own phases: the fresh pass judged this one
    # against the fresh choices of the earlier phases, not the kept ones. The kept
    # phases were spread when written, and stay so unless a provider's labels (an
    # input, which re-binds) change; so spread alone does not unbind a phase.
    candidate = record.candidates.get(model)
    if candidate is None:
        return False
    against = candidate.failures + candidate.unresolved
    return bool(against) and all(g.gate == TopologySpreadGate.name for g in against)


def status_binding_holds(agent: Agent, fresh: AgentResult) -> bool:
    """Whether the binding in the Agent's status, written by an earlier operator
    process, may stand: same generation and policy version, every phase still admitted.

    After a restart the operator has no result of its own to keep; without this every
    restart would re-bind every Agent by the live state of that moment.
    """
    status = agent.status
    if status is None or status.scheduling is None:
        return False
    if status.observed_generation != agent.metadata.generation:
        return False  # the spec changed while no operator watched
    phases = status.scheduling.phases
    if phases.keys() != fresh.phases.keys():
        return False
    version = None if fresh.policy is None else policy_version(fresh.policy)
    for phase, entry in phases.items():
        if entry.outcome != Outcome.PLACE.value or entry.model is None:
            return False
        if entry.decision is None or entry.decision.policy_version != version:
            return False  # decided before summaries, or under another policy
        if not _admits(entry.model, fresh.phases[phase].decision):
            return False
    return True


def still_feasible(kept: AgentResult, fresh: AgentResult) -> bool:
    """Whether every phase of ``kept`` is bound to a Model ``fresh`` finds feasible.

    A phase that was waiting (deferred or unschedulable) is never kept: the fresh pass
    may bind it now. A bound Model that fails a gate now (gone, its provider not ready,
    its footprint too large for the card) makes the Agent bind afresh.
    """
    if kept.phases.keys() != fresh.phases.keys():
        return False
    for phase, before in kept.phases.items():
        if before.outcome is not Outcome.PLACE or before.model is None:
            return False
        if not _admits(before.model, fresh.phases[phase].decision):
            return False
    return True


class AgentWriter:
    """Applies AgentResults: status subresource, Deployment env, events."""

    def __init__(self, kube: KubeClient, events: EventRecorder) -> None:
        self.kube = kube
        self.events = events

    async def write(self, agent: Agent, result: AgentResult, *, now: datetime) -> None:
        """Write what changed of ``result`` for ``agent``; raises :class:`KubeError`."""
        old = _status(agent)
        scheduling = result.scheduling(summaries=True).model_dump(mode="json", by_alias=True,
                                                    exclude_none=True)
        old_scheduling = old.get("scheduling") or {}
        old_last = old_scheduling.get("lastUnschedulable")
        new_last = scheduling.get("lastUnschedulable")
        if isinstance(old_last, Mapping) and isinstance(new_last, dict) and all(
            old_last.get(k) == new_last.get(k) for k in ("phase", "reason", "crewSchedulingPolicy")
        ):
            new_last["observedAt"] = old_last.get("observedAt")  # the same failure, not news
        updates = _dump(result.conditions)
        deployment = await self._apply_env(agent, result.env, now=now)
        if deployment is not None:
            updates.append(deployment)
        conditions = merge_conditions(old.get("conditions") or [], updates)
        scheduled = find_condition(conditions, "Scheduled")
        wanted = {
            **old,
            "observedGeneration": agent.metadata.generation,
            "ready": scheduled is not None and scheduled.get("status") == "True",
            "scheduling": scheduling,
            "conditions": conditions,
        }
        diff = merge_patch(old, wanted)
        if diff != {}:
            path = custom_path(agent.PLURAL, agent.metadata.name, namespace=agent.namespace,
                               subresource="status")
            await self.kube.merge_patch(path, {"status": diff})
        old_scheduled = find_condition(old.get("conditions") or [], "Scheduled")
        if scheduled is not None and scheduled.get("reason") == "Unschedulable" and not _same(
            old_scheduled, scheduled
        ):
            await self._failed_scheduling(agent, result)

    async def _failed_scheduling(self, agent: Agent, result: AgentResult) -> None:
        """FailedScheduling on the policy (as the spec says) and on the Agent itself."""
        for phase in result.phases.values():
            if phase.outcome is not Outcome.UNSCHEDULABLE:
                continue
            message = failed_scheduling_message(phase.decision, phase.phase)
            agent_ref = ObjectRef.of(agent.to_manifest())
            targets = [agent_ref]
            if result.policy is not None:
                targets.insert(0, ObjectRef.of(result.policy.to_manifest()))
            for target in targets:
                text = message if target is agent_ref else (
                    f"Agent {agent.metadata.name}: {message}"
                )
                await self.events.emit(target, type="Warning", reason="FailedScheduling",
                                       message=text)

    async def _apply_env(
        self, agent: Agent, env: Mapping[str, str], *, now: datetime
    ) -> dict[str, Any] | None:
        """Template the binding's env into the Deployment; the DeploymentPatched condition."""
        if not env:
            return None  # nothing bound yet: leave the Deployment as the crew wrote it
        env = {**env, **spec_env(agent)}  # the tools and prompts the agent process honours
        namespace = agent.namespace or "default"
        name = deployment_name(agent)
        path = deployment_path(namespace, name)
        where = f"Deployment {namespace}/{name}"
        for _ in range(2):  # one retry when the Deployment moved under us (409)
            try:
                deployment = await self.kube.get(path)
            except KubeError as error:
                return condition("DeploymentPatched", False, "PatchFailed", str(error), now=now)
            if deployment is None:
                return condition(
                    "DeploymentPatched", False, "DeploymentNotFound",
                    f"{where} does not exist; create it or set spec.deploymentRef", now=now,
                )
            try:
                patch = env_patch(deployment, env)
            except ValueError as error:
                return condition("DeploymentPatched", False, "NoContainer", f"{where}: {error}",
                                 now=now)
            if patch is not None:
                try:
                    await self.kube.merge_patch(path, patch)
                except KubeConflict:
                    continue
                except KubeError as error:
                    return condition("DeploymentPatched", False, "PatchFailed", str(error),
                                     now=now)
            return condition("DeploymentPatched", True, "EnvApplied",
                             f"{where} carries the binding's KUBEMOOT_* env", now=now)
        return condition("DeploymentPatched", False, "PatchFailed",
                         f"{where} kept changing; will retry on the next change", now=now)


def policy_conditions(
    plan: PolicyPlan, governed: Iterable[Agent], *, now: datetime
) -> list[dict[str, Any]]:
    """Valid (well-formed, phases against the MootArchetype) and Scheduled (its Agents).

    One validity condition per policy: a policy that parses but names a phase its
    archetype lacks is as invalid as one that does not parse (``InvalidSpec``, written
    by the reconciler), only with another reason.
    """
    archetype = plan.archetype.metadata.name
    if plan.problems:
        valid = condition("Valid", False, plan.problems[0][0],
                          "; ".join(message for _, message in plan.problems), now=now)
    else:
        valid = condition("Valid", True, "Valid",
                          f"well-formed; phases match MootArchetype {archetype}", now=now)
    failing: list[str] = []
    for agent in sorted(governed, key=lambda a: (a.namespace or "", a.metadata.name)):
        status = agent.status
        if status is None:
            continue
        scheduled = next((c for c in status.conditions if c.type == "Scheduled"), None)
        if scheduled is None or scheduled.reason != "Unschedulable":
            continue
        last = None if status.scheduling is None else status.scheduling.last_unschedulable
        phase = f" phase {last.phase}" if last is not None else ""
        failing.append(f"{agent.namespace}/{agent.metadata.name}{phase}")
    if failing:
        shown = ", ".join(failing[:_SHOWN])
        if len(failing) > _SHOWN:
            shown += f" and {len(failing) - _SHOWN} more"
        scheduled_condition = condition("Scheduled", False, "AgentsUnschedulable",
                                        f"unschedulable: {shown}", now=now)
    else:
        scheduled_condition = condition(
            "Scheduled", True, "NoUnschedulableAgents",
            "every governed Agent phase is bound or waits on evidence", now=now,
        )
    return [valid, scheduled_condition]
