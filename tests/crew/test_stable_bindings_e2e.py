"""Stable bindings on the cluster path: the crew's calls move models, no Pod is rolled.

The setting of ``test_cluster_e2e``: kmock for the API server with the operator on it, a
real ``nats-server``, two emulated GPUs that hold one of the two models each, and the
crew's Agents as real ``kubemoot agent`` processes started from the env of the
Deployments the operator patched. A question makes the runtime load models where its
calls go; the operator then probes, and probes again after models were moved from one
card to the other by hand. DESIGN §4 "Stable bindings": none of that is an input of the
Agents, so no Deployment may be patched (each patch would roll the crew mid-discussion).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kubemoot.agent.process import ENV_AGENT_NAME
from kubemoot.providers.ollama import OllamaProvider
from tests.crew.test_cluster_e2e import (
    AGENTS,
    FAST_ENV,
    NS,
    AgentProcess,
    ClusterPath,
    cluster_path,
    container_env,
    nats_url,
)
from tests.operator.conftest import settle

__all__ = ["nats_url"]  # the fixture, re-exported for pytest

pytestmark = pytest.mark.nats


def deployment_versions(path: ClusterPath) -> dict[str, int]:
    """How many versions each crew Deployment has had (every patch adds one)."""
    objects = path.cluster.server.objects
    return {name: len(objects["apps/v1/deployments", NS, name].history) for name in AGENTS}


def loaded(path: ClusterPath) -> dict[str, set[str]]:
    """What each provider's status says is loaded, as the operator last probed it."""
    found = {}
    for name in path.gpus:
        capacity = path.cluster.status("ModelProvider", name).get("capacity") or {}
        found[name] = {m["name"] for m in capacity.get("loadedModels") or []}
    return found


async def start(path: ClusterPath, name: str, ready_file: Path) -> AgentProcess:
    """`kubemoot agent` with its Deployment's env and a ready file for its probes."""
    env = container_env(path.cluster, name)
    assert env[ENV_AGENT_NAME] == name
    env.update(KUBEMOOT_NATS_URL=path.nats_url, KUBEMOOT_READY_FILE=str(ready_file),
               KUBEMOOT_PROMPTS_DIR=str(path.prompts))  # the ConfigMap volume's mount
    ready_file.write_text("left by an earlier run\n")  # must not vouch for this one
    agent = await AgentProcess.start({**path.base, **env, **FAST_ENV})
    path.agents[name] = agent
    await agent.ready()
    return agent


async def probe_and_settle(path: ClusterPath) -> None:
    await path.cluster.operator.call(path.cluster.reconciler.probe_all)
    await settle(path.cluster)


async def move(endpoint: str, *, load: str | None = None, unload: str | None = None) -> None:
    async with OllamaProvider("runtime", endpoint) as client:
        if unload is not None:
            await client.unload(unload)
        if load is not None:
            await client.preload(load)


async def test_calls_and_moved_models_roll_no_agent_deployment(
    kmock: Any, nats_url: str, tmp_path: Path,
) -> None:
    async with cluster_path(kmock, nats_url) as path:
        files = {name: tmp_path / f"{name}.ready" for name in AGENTS}
        await asyncio.gather(*(start(path, name, files[name]) for name in AGENTS))
        # joined their crew: the probes' file says so (written afresh by this run)
        assert {n: f.read_text() for n, f in files.items()} == dict.fromkeys(AGENTS, "ready\n")
        await settle(path.cluster)
        versions = deployment_versions(path)
        envs = {name: container_env(path.cluster, name) for name in AGENTS}
        before = loaded(path)

        first = await path.ask()  # the runtime loads models where its calls go
        await probe_and_settle(path)
        after_calls = loaded(path)
        assert after_calls != before, "the question loaded nothing: the test proves nothing"
        assert deployment_versions(path) == versions
        assert {name: container_env(path.cluster, name) for name in AGENTS} == envs

        # Move the loaded models to the other card, as a runtime evicting and loading
        # elsewhere would, and probe again. When both cards hold the same copies (calls
        # may put a second copy of a busy model on the other card), swapping changes
        # nothing, so then every model goes to one card alone.
        (a, b) = sorted(path.gpus)
        target: dict[str, set[str]] = {a: set(), b: set()}
        for here, there in ((a, b), (b, a)):
            target[there] |= set(sorted(after_calls[here])[:1])
        if target == after_calls:
            target = {a: {min(after_calls[a] | after_calls[b])}, b: set()}
        for here in (a, b):
            for model in sorted(after_calls[here]):
                await move(path.gpus[here].url, unload=model)
        for here in (a, b):
            for model in sorted(target[here]):
                await move(path.gpus[here].url, load=model)
        await probe_and_settle(path)
        assert loaded(path) != after_calls
        assert deployment_versions(path) == versions
        assert {name: container_env(path.cluster, name) for name in AGENTS} == envs

        second = await path.ask()  # the second time: the same Pods answer again
        await probe_and_settle(path)
        assert deployment_versions(path) == versions
    # stopped: the ready files are gone, so a restarted container starts "not ready"
    assert not any(f.exists() for f in files.values())

    assert first["answered"] is True, first
    assert second["answered"] is True, second
    assert {c["provider"] for c in first["calls"] + second["calls"]} == set(path.gpus)
