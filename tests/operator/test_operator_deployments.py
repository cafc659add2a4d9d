"""The crews' Deployments are watched, in the crews' namespaces only."""

from __future__ import annotations

import json

import kmock

from kubemoot.testing import builders as b

from .conftest import Cluster, Emulators, eventually, settle
from .test_operator_kopf import NS, _crew, env_of


async def test_operator_deployment_created_after_binding_gets_the_env(
    cluster: Cluster, emulators: Emulators
) -> None:
    await _crew(cluster, emulators())
    await cluster.apply(b.agent("late", NS, crew="crew-a", capabilities=["tool-calling"]))
    missing = await eventually(
        lambda: cluster.condition("Agent", "late", "DeploymentPatched", NS))
    assert missing["reason"] == "DeploymentNotFound"
    await settle(cluster)

    await cluster.create_deployment(NS, "late")  # nobody touches the Agent
    patched = await eventually(
        lambda: cluster.condition("Agent", "late", "DeploymentPatched", NS)
        .get("reason") == "EnvApplied", what="the env applied to the new Deployment")
    assert patched
    env = env_of(cluster, "late")
    assert env["KUBEMOOT_MODEL_MODEL"] == "qwen3:14b"
    assert env["KEEP"] == "me"

    # The operator's own patch comes back as an event and changes nothing more.
    await settle(cluster)
    versions = cluster.versions("Agent", "late", NS)
    await settle(cluster)
    assert cluster.versions("Agent", "late", NS) == versions


async def test_operator_watches_deployments_only_in_namespaces_with_agents(
    cluster: Cluster, emulators: Emulators
) -> None:
    await _crew(cluster, emulators())
    await cluster.create_deployment("kube-system", "coredns")
    await cluster.apply(b.agent("late", NS, crew="crew-a", capabilities=["tool-calling"]))
    await cluster.create_deployment(NS, "late")
    await eventually(lambda: cluster.condition("Agent", "late", "DeploymentPatched", NS)
                     .get("reason") == "EnvApplied", what="env applied")
    await settle(cluster)
    deployment_requests = [
        r for r in list(cluster.server)
        if r.resource is not None and r.resource.plural == "deployments"
        and r.method != "POST"  # the test's own creations
    ]
    assert any(r.action == kmock.action.WATCH for r in deployment_requests)
    assert {r.namespace for r in deployment_requests} == {NS}


async def test_operator_deployment_env_carries_the_declared_sizes_and_follows_them(
    cluster: Cluster, emulators: Emulators
) -> None:
    """The agent process has no Model resources: the env must say what they declare."""
    await _crew(cluster, emulators())
    await cluster.create_deployment(NS, "sized")
    await cluster.apply(b.agent("sized", NS, crew="crew-a", capabilities=["tool-calling"]))
    sizes = await eventually(
        lambda: env_of(cluster, "sized").get("KUBEMOOT_MODEL_SIZES_MIB"), what="sizes env")
    assert json.loads(sizes) == {"qwen3:14b": 9216, "qwen3:8b": 5120}

    # A Model's new vramMib reaches the Deployment without touching the Agent ...
    await cluster.patch("Model", "qwen3-14b", {"spec": {"vramMib": 10240}})
    await eventually(
        lambda: json.loads(env_of(cluster, "sized")["KUBEMOOT_MODEL_SIZES_MIB"])
        == {"qwen3:14b": 10240, "qwen3:8b": 5120}, what="the new size in the env")
    # ... and a size no longer declared leaves it (a patch only sets variables, so the
    # operator must overwrite the value rather than drop the variable).
    await cluster.patch("Model", "qwen3-8b", {"spec": {"vramMib": None}})
    await eventually(
        lambda: json.loads(env_of(cluster, "sized")["KUBEMOOT_MODEL_SIZES_MIB"])
        == {"qwen3:14b": 10240}, what="the undeclared size gone from the env")
