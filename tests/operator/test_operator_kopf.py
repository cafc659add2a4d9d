"""The operator end to end: kopf against kmock's Kubernetes emulator, Ollama emulators."""

from __future__ import annotations

import json
from typing import Any

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.testing import builders as b

from .conftest import Cluster, Emulators, eventually, settle

NS = "crew-a"
TOOLS = {"capability/tool-calling": "true"}


def provider_manifest(name: str, emulator: OllamaEmulator, *, vram_mib: int = 16384,
                      **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubemoot.ai/v1alpha1",
        "kind": "ModelProvider",
        "metadata": {"name": name, "annotations": {"kubemoot.ai/vram-total-mib": str(vram_mib),
                                                   **annotations}},
        "spec": {"type": "ollama", "endpoint": emulator.url, "numParallel": 2,
                 "contextLength": 4096},
    }


async def preload(emulator: OllamaEmulator, model: str) -> None:
    async with OllamaProvider("loader", emulator.url) as client:
        await client.preload(model)


def env_of(cluster: Cluster, name: str) -> dict[str, str]:
    containers = cluster.deployment(NS, name)["spec"]["template"]["spec"]["containers"]
    agent = next(c for c in containers if c["name"] == "agent")
    return {item["name"]: item.get("value", "") for item in agent.get("env", [])}


async def test_operator_probe_writes_provider_status_model_status_and_kv(
    cluster: Cluster, emulators: Emulators
) -> None:
    emulator = emulators()
    await preload(emulator, "qwen3:8b")
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120, labels=TOOLS))
    await cluster.apply(b.model("llama-70b", model_id="llama3:70b", provider="gpu-a"))
    await cluster.apply(provider_manifest("gpu-a", emulator))

    status = await eventually(
        lambda: cluster.status("ModelProvider", "gpu-a").get("ready") and
        cluster.status("ModelProvider", "gpu-a"), what="provider status")
    capacity = status["capacity"]
    assert capacity["vramTotalMiB"] == 16384
    assert capacity["maxParallel"] == 2
    assert capacity["contextLength"] == 4096
    assert [m["name"] for m in capacity["loadedModels"]] == ["qwen3:8b"]
    assert capacity["loadedModelFootprints"]["qwen3:8b"] > 0
    assert status["lastProbedAt"].endswith("Z")
    ready = cluster.condition("ModelProvider", "gpu-a", "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ProbeSucceeded")

    state = await cluster.kv_state("gpu-a")
    assert state is not None and state.ready and state.endpoint == emulator.url
    assert [m.name for m in state.loaded_models] == ["qwen3:8b"]

    model = await eventually(lambda: cluster.status("Model", "qwen3-8b").get("ready"),
                             what="Model ready")
    assert model is True
    assert cluster.status("Model", "qwen3-8b")["footprintMiB"] == (
        capacity["loadedModelFootprints"]["qwen3:8b"]
    )
    # Created before its provider it was ProviderNotFound; the probe corrects that.
    missing = await eventually(
        lambda: cluster.condition("Model", "llama-70b", "Ready").get("reason") == "NotAvailable"
        and cluster.condition("Model", "llama-70b", "Ready"))
    assert missing["status"] == "False"
    assert cluster.status("Model", "llama-70b")["ready"] is False


async def test_operator_probe_failure_marks_provider_not_ready_with_event(
    cluster: Cluster, emulators: Emulators
) -> None:
    emulator = emulators()
    url = emulator.url
    emulator.stop()  # nobody answers at this endpoint any more
    manifest = provider_manifest("gpu-gone", emulator)
    manifest["spec"]["endpoint"] = url
    await cluster.apply(manifest)
    ready = await eventually(lambda: cluster.condition("ModelProvider", "gpu-gone", "Ready"))
    assert (ready["status"], ready["reason"]) == ("False", "ProbeFailed")
    assert cluster.status("ModelProvider", "gpu-gone")["ready"] is False
    await eventually(lambda: cluster.events(reason="ProbeFailed"), what="ProbeFailed event")


async def _crew(cluster: Cluster, emulator: OllamaEmulator) -> None:
    await cluster.apply(provider_manifest("gpu-a", emulator))
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120,
                                labels={**TOOLS, "family": "qwen3", "params": "8B"}))
    await cluster.apply(b.model("qwen3-14b", provider="gpu-a", vram_mib=9216,
                                labels={**TOOLS, "family": "qwen3", "params": "14B"}))
    await cluster.apply(b.policy(
        "crew-a-default", NS, crew_ref="crew-a",
        rules=[b.rule("mulling", require=TOOLS, prefer=[(100, {"params": "14B"})]),
               b.rule("triage", require=TOOLS, prefer=[(100, {"params": "8B"})])],
    ))


async def test_operator_binds_agent_status_and_deployment_env(
    cluster: Cluster, emulators: Emulators
) -> None:
    await _crew(cluster, emulators())
    await cluster.create_deployment(NS, "kubectl-agent-deploy")
    await cluster.apply(b.agent("kubectl-agent", NS, crew="crew-a",
                                capabilities=["tool-calling"],
                                deploymentRef="kubectl-agent-deploy"))

    def bound() -> dict[str, Any] | None:
        scheduling = cluster.status("Agent", "kubectl-agent", NS).get("scheduling") or {}
        return scheduling if scheduling.get("model") == "qwen3-14b" else None

    scheduling = await eventually(bound, what="Agent bound")
    assert scheduling["provider"] == "gpu-a"
    assert scheduling["phases"]["triage"]["model"] == "qwen3-8b"
    assert cluster.condition("Agent", "kubectl-agent", "Scheduled", NS)["status"] == "True"
    patched = await eventually(
        lambda: cluster.condition("Agent", "kubectl-agent", "DeploymentPatched", NS))
    assert (patched["status"], patched["reason"]) == ("True", "EnvApplied")
    assert cluster.status("Agent", "kubectl-agent", NS)["ready"] is True

    env = env_of(cluster, "kubectl-agent-deploy")
    assert env["KEEP"] == "me"  # the crew's own env stays
    assert env["KUBEMOOT_MODEL_MODEL"] == "qwen3:14b"
    assert env["KUBEMOOT_TRIAGE_MODEL_MODEL_ID"] == "qwen3:8b"
    assert env["KUBEMOOT_MODEL_ENDPOINT"] == cluster.get("ModelProvider", "gpu-a")["spec"][
        "endpoint"]
    assert json.loads(env["KUBEMOOT_MODEL_CANDIDATES_MULLING"])[0]["model"] == "qwen3:14b"
    sidecar = cluster.deployment(NS, "kubectl-agent-deploy")["spec"]["template"]["spec"][
        "containers"][0]
    assert "env" not in sidecar

    # Nothing changed, so a settled operator writes nothing more.
    await settle(cluster)
    versions = cluster.versions("Agent", "kubectl-agent", NS)
    await cluster.reconcile(f"{NS}/kubectl-agent")
    await settle(cluster)
    assert cluster.versions("Agent", "kubectl-agent", NS) == versions


async def test_operator_missing_deployment_is_a_condition(
    cluster: Cluster, emulators: Emulators
) -> None:
    await _crew(cluster, emulators())
    await cluster.apply(b.agent("lonely", NS, crew="crew-a", capabilities=["tool-calling"]))
    patched = await eventually(
        lambda: cluster.condition("Agent", "lonely", "DeploymentPatched", NS))
    assert (patched["status"], patched["reason"]) == ("False", "DeploymentNotFound")
    assert "crew-a/lonely" in patched["message"]


async def test_operator_zero_match_sets_conditions_and_failed_scheduling_events(
    cluster: Cluster, emulators: Emulators
) -> None:
    await _crew(cluster, emulators())
    await cluster.apply(b.policy(
        "picky", "crew-b", crew_ref="picky",
        rules=[b.rule("mulling", require={"params": "405B"})],
    ))
    await cluster.apply(b.agent("dreamer", "crew-b", crew="picky"))

    # Until the provider is probed the phase waits on evidence (DEFER); then it fails.
    scheduled = await eventually(
        lambda: cluster.condition("Agent", "dreamer", "Scheduled", "crew-b")
        .get("reason") == "Unschedulable"
        and cluster.condition("Agent", "dreamer", "Scheduled", "crew-b"))
    assert scheduled["status"] == "False"
    last = cluster.status("Agent", "dreamer", "crew-b")["scheduling"]["lastUnschedulable"]
    assert last["phase"] == "mulling"
    assert last["crewSchedulingPolicy"] == "picky"
    assert "params" in last["reason"]

    def regarding() -> set[tuple[str, str]]:
        return {(e["involvedObject"]["kind"], e["involvedObject"]["name"])
                for e in cluster.events(reason="FailedScheduling")}

    await eventually(lambda: regarding() == {("CrewSchedulingPolicy", "picky"),
                                             ("Agent", "dreamer")}, what="both events")
    events = cluster.events(reason="FailedScheduling")
    message = next(e["message"] for e in events if e["involvedObject"]["kind"] == "Agent")
    assert message.startswith("0/2 models are available for phase mulling")
    policy = await eventually(
        lambda: cluster.condition("CrewSchedulingPolicy", "picky", "Scheduled", "crew-b")
        .get("reason") == "AgentsUnschedulable"
        and cluster.condition("CrewSchedulingPolicy", "picky", "Scheduled", "crew-b"))
    assert "crew-b/dreamer phase mulling" in policy["message"]

    # The same failure again is not news: no second event.
    await settle(cluster)
    count = len(cluster.events(reason="FailedScheduling"))
    await cluster.reconcile("crew-b/dreamer")
    await settle(cluster)
    assert len(cluster.events(reason="FailedScheduling")) == count


async def test_operator_policy_with_unknown_phase_is_invalid(
    cluster: Cluster, emulators: Emulators
) -> None:
    await _crew(cluster, emulators())
    await cluster.apply(b.policy("typo", "crew-c", rules=[b.rule("muling", require=TOOLS)]))
    valid = await eventually(
        lambda: cluster.condition("CrewSchedulingPolicy", "typo", "Valid", "crew-c"))
    assert (valid["status"], valid["reason"]) == ("False", "UnknownPhase")
    assert '"muling"' in valid["message"]


async def test_operator_misspelled_provider_ref_is_a_warning_on_the_model(
    cluster: Cluster, emulators: Emulators
) -> None:
    await cluster.apply(provider_manifest("gpu-a", emulators()))
    await eventually(lambda: cluster.status("ModelProvider", "gpu-a").get("ready"),
                     what="provider probed")
    await cluster.apply(b.model("qwen3-8b", provider="gpu-aa", vram_mib=5120, labels=TOOLS))
    ready = await eventually(
        lambda: cluster.condition("Model", "qwen3-8b", "Ready").get("reason")
        == "ProviderNotFound" and cluster.condition("Model", "qwen3-8b", "Ready"))
    assert ready["status"] == "False"
    assert "spec.providerRef" in ready["message"] and 'did you mean "gpu-a"' in ready["message"]
    [event] = await eventually(lambda: cluster.events(reason="ProviderNotFound"),
                               what="a ProviderNotFound event")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Model"
    assert event["involvedObject"]["name"] == "qwen3-8b"
    await settle(cluster)
    assert len(cluster.events(reason="ProviderNotFound")) == 1  # not on every reconcile

    # Deleting the provider a Model names turns that Model into the same warning.
    await cluster.apply(b.model("phi3-mini", provider="gpu-a", vram_mib=2048, labels=TOOLS))
    await eventually(lambda: cluster.status("Model", "phi3-mini").get("ready"),
                     what="phi3-mini ready")
    await cluster.http.delete("/apis/kubemoot.ai/v1alpha1/modelproviders/gpu-a")
    await eventually(lambda: cluster.condition("Model", "phi3-mini", "Ready").get("reason")
                     == "ProviderNotFound", what="phi3-mini loses its provider")


async def test_operator_runtime_requirement_checked_against_the_probed_version(
    cluster: Cluster, emulators: Emulators
) -> None:
    from kubemoot.emulation.server import EMULATOR_VERSION

    await cluster.apply(provider_manifest("gpu-a", emulators()))
    status = await eventually(lambda: cluster.status("ModelProvider", "gpu-a").get("ready")
                              and cluster.status("ModelProvider", "gpu-a"), what="probed")
    assert status["runtimeVersion"] == EMULATOR_VERSION  # "0.12.0-…": older than 1.0
    state = await cluster.kv_state("gpu-a")
    assert state is not None and state.runtime_version == EMULATOR_VERSION

    await cluster.apply(b.model("qwen3-14b", provider="gpu-a", vram_mib=9216,
                                runtime="ollama>=1.0", labels={**TOOLS, "params": "14B"}))
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120,
                                runtime="ollama<1", labels={**TOOLS, "params": "8B"}))
    await cluster.apply(b.policy("picky", "crew-v", crew_ref="v", rules=[
        b.rule("mulling", require={"params": "14B"}),
        b.rule("triage", require={"params": "8B"})]))
    await cluster.apply(b.agent("versioned", "crew-v", crew="v"))

    def phases() -> dict[str, Any]:
        scheduling = cluster.status("Agent", "versioned", "crew-v").get("scheduling") or {}
        found = scheduling.get("phases") or {}
        return found if len(found) == 2 else {}

    found = await eventually(phases, what="both phases scheduled")
    await settle(cluster)
    found = phases()
    assert found["triage"]["outcome"] == "PLACE"
    assert found["mulling"]["outcome"] == "UNSCHEDULABLE"
    events = cluster.events(reason="FailedScheduling")
    assert any("runtime version not met" in e["message"] for e in events)


async def test_operator_status_follows_kubernetes_conventions(
    cluster: Cluster, emulators: Emulators
) -> None:
    import re

    emulator = emulators()
    await preload(emulator, "qwen3:8b")
    await preload(emulator, "phi3:mini")
    await _crew(cluster, emulator)
    await eventually(lambda: cluster.status("ModelProvider", "gpu-a").get("ready"),
                     what="provider probed")
    await cluster.apply(b.archetype())
    agent = b.agent("conventional", NS, crew="crew-a", capabilities=["tool-calling"]
                    ).to_manifest()
    agent["metadata"]["generation"] = 3  # kmock keeps what it is given
    await cluster.apply(agent)
    status = await eventually(
        lambda: cluster.status("Agent", "conventional", NS).get("observedGeneration") == 3
        and cluster.status("Agent", "conventional", NS), what="observedGeneration")
    await eventually(lambda: cluster.condition("Agent", "conventional", "Scheduled", NS)
                     .get("reason") == "Bound", what="bound")
    await settle(cluster)
    status = cluster.status("Agent", "conventional", NS)
    resolved = cluster.condition("Agent", "conventional", "PolicyResolved", NS)
    assert (resolved["status"], resolved["reason"]) == ("True", "PolicyMatched")

    # One validity condition on a policy.
    types = [c["type"] for c in cluster.status("CrewSchedulingPolicy", "crew-a-default",
                                              NS)["conditions"]]
    assert "Valid" in types and "PolicyValid" not in types
    assert len(types) == len(set(types))

    # Columns read joined strings, not a [*] path that prints one item.
    provider = cluster.status("ModelProvider", "gpu-a")
    assert set(provider["capacity"]["loadedModelNames"].split(", ")) == {"qwen3:8b",
                                                                         "phi3:mini"}
    archetype = await eventually(lambda: cluster.status("MootArchetype", "consent-3")
                                 .get("phaseNames"), what="phaseNames")
    assert archetype == "mulling, triage"

    # One timestamp precision: whole seconds, UTC, everywhere the operator writes one.
    whole = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    stamps = [c["lastTransitionTime"] for c in status["conditions"]]
    stamps += [c["lastTransitionTime"] for c in provider["conditions"]]
    stamps.append(provider["lastProbedAt"])
    assert stamps and all(whole.match(s) for s in stamps), stamps


async def test_operator_unschedulable_observed_at_has_whole_seconds(
    cluster: Cluster, emulators: Emulators
) -> None:
    import re

    await _crew(cluster, emulators())
    await cluster.apply(b.policy("picky", "crew-b", crew_ref="picky",
                                 rules=[b.rule("mulling", require={"params": "405B"})]))
    await cluster.apply(b.agent("dreamer", "crew-b", crew="picky"))
    last = await eventually(
        lambda: cluster.status("Agent", "dreamer", "crew-b")["scheduling"]["lastUnschedulable"],
        what="lastUnschedulable")
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", last["observedAt"]), last
