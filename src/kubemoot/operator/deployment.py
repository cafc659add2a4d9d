"""The Agent's Deployment: which one, which container, and its ``KUBEMOOT_*`` env.

Decision: the operator **patches a Deployment the crew owns**; it never creates or
deletes one. The crew's chart knows the image, tools, secrets and volumes of an agent;
the scheduler knows only where it should run. The Deployment is ``spec.deploymentRef``
of the Agent, else the Deployment named like the Agent, in the Agent's namespace. In it
the container named ``agent`` gets the env (else the first container).

Only the variables a binding produces are written; every other env entry and every
other field stays as the crew set it. A phase that becomes unschedulable loses its
binding variables and gets its ``…_UNSCHEDULABLE_REASON`` instead (the spec: no LLM call
for a phase nothing can serve); a deferred phase keeps its last binding, since the
evidence it waits for may come with the next probe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubemoot.api import Agent
from kubemoot.scheduling.bind import ENV_BINDING, ENV_UNSCHEDULABLE, unset_variables

__all__ = ["AGENT_CONTAINER", "carries_binding", "deployment_name", "env_patch", "spec_env"]

AGENT_CONTAINER = "agent"
#: The Agent's spec the agent process honours (kubemoot.agent.spec_env reads them).
ENV_ENABLED_TOOLS = "KUBEMOOT_AGENT_ENABLED_TOOLS"
ENV_PROMPT_REFS = "KUBEMOOT_AGENT_PROMPT_REFS"


def spec_env(agent: Agent) -> dict[str, str]:
    """``spec.enabledTools`` and ``spec.promptRefs`` as JSON lists, written with every
    binding (``[]`` included: a patch only sets variables, so an emptied list must be
    overwritten to reach the pod)."""
    return {ENV_ENABLED_TOOLS: json.dumps(agent.spec.enabled_tools),
            ENV_PROMPT_REFS: json.dumps(agent.spec.prompt_refs)}


def deployment_name(agent: Agent) -> str:
    """``spec.deploymentRef``, else the Agent's own name."""
    return agent.spec.deployment_ref or agent.metadata.name


def _container_index(containers: list[Any]) -> int | None:
    for index, container in enumerate(containers):
        if isinstance(container, Mapping) and container.get("name") == AGENT_CONTAINER:
            return index
    return 0 if containers and isinstance(containers[0], Mapping) else None


def carries_binding(deployment: Mapping[str, Any]) -> bool:
    """Whether the agent container holds a binding's variables (a model or a reason)."""
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = list(pod.get("containers") or [])
    index = _container_index(containers)
    if index is None:
        return False
    names = {str(item.get("name")) for item in containers[index].get("env") or []
             if isinstance(item, Mapping)}
    marks = {binding[0] for binding in ENV_BINDING.values()} | set(ENV_UNSCHEDULABLE.values())
    return bool(names & marks)


def env_patch(deployment: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any] | None:
    """A merge patch setting ``env`` on the agent container; None when nothing changes.

    Merge patch replaces lists whole, so the patch carries every container as it was,
    with only the agent container's env changed, and the ``resourceVersion`` it read,
    so a concurrent change of the Deployment makes the API server refuse (409) instead
    of losing that change. Raises ``ValueError`` when the Deployment has no container.
    """
    spec = deployment.get("spec") or {}
    template = spec.get("template") or {}
    pod = template.get("spec") or {}
    containers = list(pod.get("containers") or [])
    index = _container_index(containers)
    if index is None:
        raise ValueError("the Deployment has no containers in spec.template.spec.containers")
    container = dict(containers[index])
    unset = unset_variables(env)
    listed = [dict(item) for item in container.get("env") or [] if isinstance(item, Mapping)]
    current = [item for item in listed if str(item.get("name")) not in unset]
    changed = len(current) != len(listed)
    seen: set[str] = set()
    for item in current:
        name = str(item.get("name"))
        if name in env:
            seen.add(name)
            if item.get("value") != env[name] or "valueFrom" in item:
                item.pop("valueFrom", None)
                item["value"] = env[name]
                changed = True
    for name in sorted(env):
        if name not in seen:
            current.append({"name": name, "value": env[name]})
            changed = True
    if not changed:
        return None
    container["env"] = current
    containers[index] = container
    patch: dict[str, Any] = {"spec": {"template": {"spec": {"containers": containers}}}}
    version = (deployment.get("metadata") or {}).get("resourceVersion")
    if version:
        patch["metadata"] = {"resourceVersion": version}
    return patch
