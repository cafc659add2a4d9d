"""The operator's batches: one pass in (namespace, name) order over a kept roster.

A change that concerns several Agents schedules them in one pass, in the order
``kubemoot schedule`` binds a bundle, (namespace, name), not the order of the
``namespace/name`` strings (``crew-a-b/…`` sorts before ``crew-a/…`` as a string, after
it as a pair). A batch of every Agent reuses the roster the reconciler keeps, brought up
to the view by what changed since the last one.
"""

from __future__ import annotations

from typing import Any

from kubemoot.scheduling.scheduler import schedule_bundle
from kubemoot.scheduling.snapshot import ClusterSnapshot
from kubemoot.testing import builders as b

from . import test_stable_bindings as solo
from .conftest import Cluster, Emulators, eventually, operator_requests, settle
from .test_operator_kopf import TOOLS, provider_manifest

#: Two namespaces whose pair order and string order disagree.
FIRST, SECOND = "crew-a", "crew-a-b"
NAMES = ("a0", "a1", "a2", "a3", "a4")  # more than the provider takes


def phases(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    scheduling = cluster.status("Agent", name, namespace).get("scheduling") or {}
    return dict(scheduling.get("phases") or {})


def bound(cluster: Cluster, namespace: str, name: str) -> bool:
    found = phases(cluster, namespace, name)
    return bool(found) and all(p.get("outcome") == "PLACE" for p in found.values())


def written(cluster: Cluster, namespace: str, name: str) -> bool:
    return bool(phases(cluster, namespace, name))


async def agents_waiting_for_a_model(cluster: Cluster, emulators: Emulators) -> None:
    """One provider that takes fewer Agents than the ten, five in each namespace, no Model yet."""
    await cluster.apply(provider_manifest("gpu-a", emulators()))
    for namespace in (SECOND, FIRST):
        for name in NAMES:
            await cluster.apply(b.agent(name, namespace))
    await eventually(lambda: all(written(cluster, ns, n) for ns in (FIRST, SECOND)
                                 for n in NAMES), what="every Agent written")
    await settle(cluster)


async def test_a_batch_binds_in_namespace_then_name_order(
    cluster: Cluster, emulators: Emulators
) -> None:
    await agents_waiting_for_a_model(cluster, emulators)
    assert not any(bound(cluster, ns, n) for ns in (FIRST, SECOND) for n in NAMES)
    mark = len(cluster.reconciler.reconciled)

    # The Model concerns every Agent (none has a policy): one batch of ten.
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120,
                                labels={**TOOLS, "family": "qwen3"}))
    await eventually(lambda: any(bound(cluster, FIRST, n) for n in NAMES),
                     what="the first Agents bound")
    await settle(cluster)

    batch = [key for key, cause in cluster.reconciler.reconciled[mark:]
             if cause == "Model/qwen3-8b"]
    expected = [f"{ns}/{n}" for ns in (FIRST, SECOND) for n in NAMES]
    # Its first batch (the Model's status coming back may trigger a second, alike).
    assert batch[: len(expected)] == expected  # string order would put crew-a-b first
    order = [(ns, n) for ns in (FIRST, SECOND) for n in NAMES]
    states = [bound(cluster, ns, n) for ns, n in order]
    taken = states.count(True)
    assert 0 < taken < len(order), "the provider must take some Agents, not all"
    assert states == [True] * taken + [False] * (len(order) - taken)


async def test_the_kept_roster_follows_the_agents_and_binds_as_a_bundle_pass(
    cluster: Cluster, emulators: Emulators
) -> None:
    await agents_waiting_for_a_model(cluster, emulators)
    reconciler = cluster.reconciler
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120,
                                labels={**TOOLS, "family": "qwen3"}))
    await eventually(lambda: any(bound(cluster, FIRST, n) for n in NAMES),
                     what="the first Agents bound")
    await settle(cluster)
    assert len(reconciler.roster) == 2 * len(NAMES)

    await cluster.delete("Agent", "a0", namespace=FIRST)
    await cluster.apply(b.agent("a5", FIRST, capabilities=["tool-calling"]))
    await eventually(lambda: written(cluster, FIRST, "a5"), what="the new Agent written")
    await settle(cluster)
    # A Model change that concerns every Agent: the kept roster, brought up to date.
    await cluster.apply(b.model("phi3-mini", provider="gpu-a", vram_mib=2048,
                                labels={**TOOLS, "family": "phi3"}))
    await eventually(lambda: cluster.status("Model", "phi3-mini"),
                     what="the second Model seen")
    await settle(cluster)
    keys = sorted((s.namespace, a.metadata.name) for s in reconciler.roster.segments()
                  for a in s.agents)
    assert keys == sorted([(FIRST, n) for n in (*NAMES[1:], "a5")]
                          + [(SECOND, n) for n in NAMES])
    assert len(reconciler.roster) == len(keys)

    # The same Agents filed afresh bind alike: the kept roster is the view.
    view = reconciler.view()
    fresh = ClusterSnapshot.build(models=view.models.values(),
                                  providers=view.providers.values(),
                                  agents=view.agents.values())
    kept = ClusterSnapshot.build(models=view.models.values(),
                                 providers=view.providers.values(),
                                 roster=reconciler.roster)
    now = reconciler.now()
    assert ([r.to_dict() for r in schedule_bundle(kept, now=now).agents]
            == [r.to_dict() for r in schedule_bundle(fresh, now=now).agents])


async def test_a_recheck_that_keeps_the_result_writes_and_reads_nothing(
    cluster: Cluster, emulators: Emulators
) -> None:
    """Live evidence keeps a binding (DESIGN §4); the kept result is what the operator
    last wrote, so the recheck neither patches the Agent nor reads its Deployment."""
    endpoints = await solo.two_cards(cluster, emulators)
    first = solo.bound(cluster)
    here = first["provider"]
    agent_versions = cluster.versions("Agent", solo.AGENT, solo.NS)
    mark, sent = len(cluster.reconciler.reconciled), len(operator_requests(cluster.server))

    await solo.move(endpoints[here], load="qwen3:8b")  # a call loaded the model there
    await solo.probe_all(cluster)
    await eventually(lambda: solo.rechecked(cluster, mark, here),
                     what="the Agent rechecked against the new evidence")
    await settle(cluster)
    assert solo.bound(cluster) == first
    assert cluster.versions("Agent", solo.AGENT, solo.NS) == agent_versions
    # Requests that name the Agent or its Deployment (not the watches and lists).
    touched = [request for request in operator_requests(cluster.server)[sent:]
               if request.name == solo.AGENT and request.resource is not None
               and request.resource.plural in ("deployments", "agents")]
    assert touched == []
