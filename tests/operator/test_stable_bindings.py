"""Stable bindings (DESIGN §4): live activity never moves a binding; inputs and failed
gates do; an UNSCHEDULABLE phase trades its binding env for its reason.

One Agent, two emulated 16 GiB cards that both hold ``qwen3:8b``. The scores of the two
copies differ only by what is live on each card (free VRAM, what is loaded), which is
exactly what must not roll the Agent's Deployment.
"""

from __future__ import annotations

import json
from typing import Any

from kubemoot.providers.ollama import OllamaProvider
from kubemoot.store.declared import DeclaredSize
from kubemoot.store.keys import encode_token
from kubemoot.testing import builders as b

from .conftest import Cluster, Emulators, OperatorThread, eventually, settle
from .test_operator_kopf import TOOLS, env_of, provider_manifest

NS, AGENT = "crew-a", "solo"
QWEN = {**TOOLS, "family": "qwen3", "params": "8B"}
BINDING = ("KUBEMOOT_MODEL_MODEL", "KUBEMOOT_MODEL_ENDPOINT",
           "KUBEMOOT_MODEL_CANDIDATES_MULLING")
REASON = "KUBEMOOT_MODEL_UNSCHEDULABLE_REASON"


def bound(cluster: Cluster) -> dict[str, Any]:
    phases = cluster.status("Agent", AGENT, NS).get("scheduling", {}).get("phases", {})
    return dict(phases.get("mulling") or {})


def deployment_versions(cluster: Cluster) -> int:
    """How many versions the Agent's Deployment has had (each patch adds one)."""
    return len(cluster.server.objects["apps/v1/deployments", NS, AGENT].history)


def rechecked(cluster: Cluster, mark: int, provider: str) -> bool:
    """Whether the operator scheduled the Agent again for news of ``provider``."""
    return any(cause.startswith(f"ModelProvider/{provider}")
               for _, cause in cluster.reconciler.reconciled[mark:])


async def two_cards(cluster: Cluster, emulators: Emulators) -> dict[str, str]:
    """gpu-a and gpu-b with a copy of qwen3:8b each; the Agent bound to one of them.
    Returns provider name → endpoint."""
    endpoints: dict[str, str] = {}
    for name in ("gpu-a", "gpu-b"):
        emulator = emulators()
        endpoints[name] = emulator.url
        await cluster.apply(provider_manifest(name, emulator))
        await cluster.apply(b.model(f"qwen3-8b-{name}", model_id="qwen3:8b", provider=name,
                                    vram_mib=5120, labels=QWEN))
    await cluster.apply(b.model("phi3-mini", model_id="phi3:mini", provider="gpu-a",
                                vram_mib=2048, labels={**TOOLS, "family": "phi3"}))
    await cluster.apply(b.policy("pilot", NS, crew_ref="pilot", rules=[
        b.rule(phase, require={"family": "qwen3"}) for phase in ("mulling", "triage")]))
    await cluster.create_deployment(NS, AGENT)
    await cluster.apply(b.agent(AGENT, NS, crew="pilot", capabilities=["tool-calling"]))
    await eventually(lambda: env_of(cluster, AGENT).get("KUBEMOOT_MODEL_ENDPOINT"),
                     what="the Agent bound and its Deployment patched")
    await settle(cluster)
    return endpoints


async def move(endpoint: str, *, load: str | None = None, unload: str | None = None) -> None:
    """What per-call placements do to a card: load a model, unload another."""
    async with OllamaProvider("runtime", endpoint) as client:
        if unload is not None:
            await client.unload(unload)
        if load is not None:
            await client.preload(load)


async def probe_all(cluster: Cluster) -> None:
    await cluster.operator.call(cluster.reconciler.probe_all)


async def test_loads_that_move_models_between_cards_patch_no_deployment(
    cluster: Cluster, emulators: Emulators
) -> None:
    endpoints = await two_cards(cluster, emulators)
    first = bound(cluster)
    here = first["provider"]
    there = next(name for name in endpoints if name != here)
    env, versions = env_of(cluster, AGENT), deployment_versions(cluster)

    # 1. The bound card fills up with a load (less free VRAM, and the copy there loaded):
    #    scored afresh, the other card would now win.
    mark = len(cluster.reconciler.reconciled)
    await move(endpoints[here], load="qwen3:8b")
    await probe_all(cluster)
    await eventually(lambda: rechecked(cluster, mark, here),
                     what="the Agent rechecked against the new evidence")
    await settle(cluster)
    loaded = cluster.status("ModelProvider", here)["capacity"]["loadedModels"]
    assert [m["name"] for m in loaded] == ["qwen3:8b"]
    assert deployment_versions(cluster) == versions
    assert env_of(cluster, AGENT) == env and bound(cluster) == first

    # 2. The runtime moves the model to the other card, then loads more beside it there.
    mark = len(cluster.reconciler.reconciled)
    await move(endpoints[here], unload="qwen3:8b")
    await move(endpoints[there], load="qwen3:8b")
    await move(endpoints[there], load="phi3:mini")
    await probe_all(cluster)
    await eventually(lambda: rechecked(cluster, mark, there),
                     what="the Agent rechecked after the move")
    await settle(cluster)
    assert {m["name"] for m in
            cluster.status("ModelProvider", there)["capacity"]["loadedModels"]} == {
        "qwen3:8b", "phi3:mini"}
    assert cluster.status("ModelProvider", here)["capacity"].get("loadedModels") in (None, [])
    assert deployment_versions(cluster) == versions
    assert env_of(cluster, AGENT) == env and bound(cluster) == first

    # 3. The second time: an unrelated probe after all that still moves nothing.
    await probe_all(cluster)
    await settle(cluster)
    assert deployment_versions(cluster) == versions


async def test_a_deleted_model_rebinds_to_the_other_copy(
    cluster: Cluster, emulators: Emulators
) -> None:
    endpoints = await two_cards(cluster, emulators)
    here = bound(cluster)["provider"]
    there = next(name for name in endpoints if name != here)

    await cluster.delete("Model", f"qwen3-8b-{here}")
    await eventually(lambda: env_of(cluster, AGENT)["KUBEMOOT_MODEL_ENDPOINT"]
                     == endpoints[there], what="the Deployment following the other copy")
    await eventually(lambda: bound(cluster)["model"] == f"qwen3-8b-{there}",
                     what="the status following the other copy")


async def test_a_provider_found_not_ready_rebinds_its_agents(
    cluster: Cluster, emulators: Emulators
) -> None:
    endpoints = await two_cards(cluster, emulators)
    here = bound(cluster)["provider"]
    there = next(name for name in endpoints if name != here)

    emulators.at(endpoints[here]).fail_next(503, count=1000)  # the card stops answering
    await cluster.operator.call(lambda: cluster.reconciler.probe(here))
    await eventually(lambda: env_of(cluster, AGENT)["KUBEMOOT_MODEL_ENDPOINT"]
                     == endpoints[there], what="the Deployment leaving the failed card")
    assert cluster.status("ModelProvider", here)["ready"] is False
    failures = await eventually(lambda: bound(cluster)["provider"] == there
                                and bound(cluster)["decision"]["topFailures"])
    assert failures[0]["gate"] == "ProviderReady" and failures[0]["count"] == 1


async def test_a_policy_edit_rebinds(cluster: Cluster, emulators: Emulators) -> None:
    await two_cards(cluster, emulators)
    version = bound(cluster)["decision"]["policyVersion"]
    await cluster.patch("CrewSchedulingPolicy", "pilot", {"spec": {"rules": [
        {"phase": phase, "require": {"matchLabels": {"family": "phi3"}}}
        for phase in ("mulling", "triage")]}}, namespace=NS)
    await eventually(lambda: env_of(cluster, AGENT)["KUBEMOOT_MODEL_MODEL"] == "phi3:mini",
                     what="the Deployment following the edited policy")
    await eventually(lambda: bound(cluster)["decision"]["policyVersion"] != version,
                     what="the status naming the policy's new version")


async def test_an_unschedulable_phase_loses_its_binding_and_gets_its_reason(
    cluster: Cluster, emulators: Emulators
) -> None:
    endpoints = await two_cards(cluster, emulators)
    assert REASON not in env_of(cluster, AGENT)

    await cluster.patch("CrewSchedulingPolicy", "pilot", {"spec": {"rules": [
        {"phase": "mulling", "require": {"matchLabels": {"family": "llama"}}},
        {"phase": "triage", "require": {"matchLabels": {"family": "qwen3"}}}]}}, namespace=NS)
    reason = await eventually(lambda: env_of(cluster, AGENT).get(REASON),
                              what="the reason in the Deployment")
    assert reason.startswith("0/3 models are available for phase mulling:")
    env = env_of(cluster, AGENT)
    assert not set(BINDING) & set(env), env  # no model to call in that phase
    assert env["KUBEMOOT_TRIAGE_MODEL_MODEL_ID"] == "qwen3:8b"  # triage is untouched
    assert env["KEEP"] == "me"  # the crew's own env stays
    summary = await eventually(lambda: bound(cluster)["outcome"] == "UNSCHEDULABLE"
                               and bound(cluster)["decision"], what="the status")
    assert (summary["feasible"], summary["failed"]) == (0, 3)
    assert summary["topFailures"][0]["gate"] == "Require"

    # Schedulable again: the binding comes back and the reason goes, in one patch.
    await cluster.patch("CrewSchedulingPolicy", "pilot", {"spec": {"rules": [
        {"phase": phase, "require": {"matchLabels": {"family": "qwen3"}}}
        for phase in ("mulling", "triage")]}}, namespace=NS)
    await eventually(lambda: REASON not in env_of(cluster, AGENT), what="the reason removed")
    env = env_of(cluster, AGENT)
    assert env["KUBEMOOT_MODEL_MODEL"] == "qwen3:8b"
    assert env["KUBEMOOT_MODEL_ENDPOINT"] in endpoints.values()


async def test_the_phase_status_keeps_a_bounded_decision_summary(
    cluster: Cluster, emulators: Emulators
) -> None:
    await two_cards(cluster, emulators)
    summary = bound(cluster)["decision"]
    assert (summary["feasible"], summary["uncertain"], summary["failed"]) == (2, 0, 1)
    assert summary["topFailures"] == [{"gate": "Require", "count": 1,
                                       "reason": summary["topFailures"][0]["reason"]}]
    assert summary["schedulerVersion"].startswith("kubemoot-scheduler/")
    assert summary["scoringPolicyVersion"]
    assert summary["policyVersion"].startswith("sha256:")
    assert summary["recheckTriggers"]


async def test_declared_sizes_are_published_and_follow_the_models(
    cluster: Cluster, emulators: Emulators
) -> None:
    await two_cards(cluster, emulators)
    sizes = cluster.operator.sizes
    assert sizes is not None

    async def published() -> dict[str, DeclaredSize]:
        async def read() -> dict[str, DeclaredSize]:
            found = {}
            for key in await sizes.keys():
                entry = await sizes.get(key)
                if entry is not None:
                    found[key] = DeclaredSize.from_json(entry.value)
            return found
        result: dict[str, DeclaredSize] = await cluster.operator.call(read)
        return result

    docs = await published()
    assert {key: (d.model, d.vram_mib, d.declared_by) for key, d in docs.items()} == {
        encode_token("qwen3:8b"): ("qwen3:8b", 5120, ["qwen3-8b-gpu-a", "qwen3-8b-gpu-b"]),
        encode_token("phi3:mini"): ("phi3:mini", 2048, ["phi3-mini"]),
    }
    # The larger of two declarations wins; a Model that is gone declares nothing.
    await cluster.patch("Model", "qwen3-8b-gpu-b", {"spec": {"vramMib": 6000}})
    await cluster.delete("Model", "phi3-mini")

    async def followed() -> bool:
        docs = await published()
        qwen = docs.get(encode_token("qwen3:8b"))
        return (set(docs) == {encode_token("qwen3:8b")} and qwen is not None
                and qwen.vram_mib == 6000)

    await eventually(followed, what="the published sizes following the Models")
    await settle(cluster)
    body = json.loads((await published())[encode_token("qwen3:8b")].to_json())
    assert set(body) == {"version", "model", "vramMiB", "declaredBy", "updatedAt"}


async def test_a_restarted_operator_keeps_the_bindings_it_finds(
    cluster: Cluster, emulators: Emulators
) -> None:
    """A restart is no input of any Agent: the new process keeps what the old one bound
    while it stands, even though the live state now scores the other card higher."""
    endpoints = await two_cards(cluster, emulators)
    first = bound(cluster)
    here = first["provider"]
    env, versions = env_of(cluster, AGENT), deployment_versions(cluster)
    # The API server stamps every object at creation; kmock does not, so do it here.
    stamp = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}}
    for kind, name, namespace in (
        [("ModelProvider", p, None) for p in endpoints]
        + [("Model", f"qwen3-8b-{p}", None) for p in endpoints]
        + [("Model", "phi3-mini", None), ("CrewSchedulingPolicy", "pilot", NS),
           ("Agent", AGENT, NS)]
    ):
        await cluster.patch(kind, name, stamp, namespace=namespace)
    # The bound card fills up and the old operator records it (and keeps the binding):
    # the status the new process starts from now scores the other card higher.
    await move(endpoints[here], load="qwen3:8b")
    await probe_all(cluster)
    await eventually(
        lambda: cluster.status("ModelProvider", here)["capacity"]["loadedModels"],
        what="the old operator recording the load")
    await settle(cluster)
    versions = deployment_versions(cluster)
    assert env_of(cluster, AGENT) == env
    await cluster.operator.stop()

    restarted = OperatorThread(cluster.operator.server_url)
    restarted.start()
    try:
        assert restarted.reconciler is not None and restarted.bucket is not None
        again = Cluster(cluster.server, cluster.http, restarted.reconciler, restarted.bucket,
                        restarted)
        await eventually(lambda: any(key == f"{NS}/{AGENT}"
                                     for key, _ in restarted.reconciler.reconciled),
                         what="the new operator judging the Agent")
        await settle(again)
        assert deployment_versions(cluster) == versions
        assert env_of(cluster, AGENT) == env
        assert bound(cluster)["model"] == first["model"]

        # Inputs still re-bind under the new process: the bound copy goes away.
        await cluster.delete("Model", f"qwen3-8b-{here}")
        there = next(name for name in endpoints if name != here)
        await eventually(lambda: env_of(cluster, AGENT)["KUBEMOOT_MODEL_ENDPOINT"]
                         == endpoints[there], what="a re-bind after the restart")
    finally:
        await restarted.stop()
