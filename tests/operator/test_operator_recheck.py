"""Recheck triggers the operator must act on: refreshed evidence, freed slots, bursts."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from kubemoot.testing import builders as b

from .conftest import Cluster, Emulators, eventually, settle
from .test_operator_kopf import TOOLS, provider_manifest

NS = "crew-r"
LIMIT = 4  # numParallel 1 × the default concurrency factor 4


def outcomes(cluster: Cluster, name: str) -> set[str]:
    scheduling = cluster.status("Agent", name, NS).get("scheduling") or {}
    return {phase.get("outcome") for phase in (scheduling.get("phases") or {}).values()}


def placed(cluster: Cluster, names: list[str]) -> list[str]:
    return [n for n in names if outcomes(cluster, n) == {"PLACE"}]


async def one_slot_provider(cluster: Cluster, emulators: Emulators) -> None:
    manifest = provider_manifest("gpu-a", emulators())
    manifest["spec"]["numParallel"] = 1
    await cluster.apply(manifest)
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120, labels=TOOLS))
    await cluster.apply(b.policy("r-policy", NS, crew_ref="r",
                                 rules=[b.rule("mulling", require=TOOLS)]))
    await eventually(lambda: cluster.status("ModelProvider", "gpu-a").get("ready"),
                     what="provider probed")


async def test_operator_refreshed_evidence_rechecks_a_deferred_agent(
    cluster: Cluster, emulators: Emulators
) -> None:
    await cluster.apply(provider_manifest("gpu-a", emulators()))
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120, labels=TOOLS))
    await cluster.apply(b.policy("r-policy", NS, crew_ref="r", max_age_seconds=120,
                                 rules=[b.rule("mulling", require=TOOLS)]))
    await cluster.apply(b.agent("a1", NS, crew="r"))
    await eventually(lambda: outcomes(cluster, "a1") == {"PLACE"}, what="a1 bound")
    await settle(cluster)

    # The probes stopped for a while (the operator was down): the status is stale.
    await cluster.patch("ModelProvider", "gpu-a", {"status": {
        "lastProbedAt": "2020-01-01T00:00:00Z"}}, subresource="status")
    await settle(cluster)
    await cluster.reconcile(f"{NS}/a1")
    await eventually(lambda: outcomes(cluster, "a1") == {"DEFER"}, what="a1 deferred")
    scheduled = cluster.condition("Agent", "a1", "Scheduled", NS)
    assert scheduled["reason"] == "SchedulingDeferred"

    # A fresh probe finds the provider as it was: only lastProbedAt moves.
    await cluster.operator.call(lambda: cluster.reconciler.probe("gpu-a"))
    await eventually(lambda: outcomes(cluster, "a1") == {"PLACE"},
                     what="a1 bound again after the refresh")
    probed = cluster.status("ModelProvider", "gpu-a")["lastProbedAt"]
    assert datetime.fromisoformat(probed) > datetime(2020, 1, 2, tzinfo=UTC)


async def test_operator_refresh_of_fresh_evidence_moves_no_bound_agent(
    cluster: Cluster, emulators: Emulators
) -> None:
    await one_slot_provider(cluster, emulators)
    await cluster.apply(b.agent("a1", NS, crew="r"))
    await eventually(lambda: outcomes(cluster, "a1") == {"PLACE"}, what="a1 bound")
    await settle(cluster)
    mark = len(cluster.reconciler.reconciled)
    await cluster.operator.call(lambda: cluster.reconciler.probe("gpu-a"))
    await settle(cluster)
    assert cluster.reconciler.reconciled[mark:] == []


async def test_operator_burst_of_agents_respects_the_parallelism_limit(
    cluster: Cluster, emulators: Emulators
) -> None:
    await one_slot_provider(cluster, emulators)
    names = [f"a{i}" for i in range(8)]
    await asyncio.gather(*(cluster.apply(b.agent(n, NS, crew="r")) for n in names))
    await eventually(lambda: all(outcomes(cluster, n) for n in names),
                     what="every Agent scheduled")
    await settle(cluster)
    assert len(placed(cluster, names)) == LIMIT
    assert cluster.status("ModelProvider", "gpu-a") is not None
    for name in set(names) - set(placed(cluster, names)):
        assert cluster.condition("Agent", name, "Scheduled", NS)["reason"] == "Unschedulable"


async def test_operator_deleting_an_agent_frees_its_slot(
    cluster: Cluster, emulators: Emulators
) -> None:
    await one_slot_provider(cluster, emulators)
    names = [f"a{i}" for i in range(LIMIT + 1)]
    for name in names:  # one at a time: the last one finds the provider full
        await cluster.apply(b.agent(name, NS, crew="r"))
        await eventually(lambda name=name: outcomes(cluster, name), what=f"{name} scheduled")
        await settle(cluster)
    assert placed(cluster, names) == names[:LIMIT]
    assert outcomes(cluster, names[-1]) == {"UNSCHEDULABLE"}

    await cluster.delete("Agent", names[0], namespace=NS)
    await eventually(lambda: outcomes(cluster, names[-1]) == {"PLACE"},
                     what="the waiting Agent takes the freed slot")
    await settle(cluster)
    assert placed(cluster, names[1:]) == names[1:]
