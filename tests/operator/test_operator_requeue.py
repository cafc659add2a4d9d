"""State-driven requeue and bad input: the operator against kmock and Ollama emulators."""

from __future__ import annotations

from typing import Any

from kubemoot.testing import builders as b

from .conftest import Cluster, Emulators, eventually, settle
from .test_operator_kopf import TOOLS, preload, provider_manifest

Q, P = "crew-q", "crew-p"


def bound_model(cluster: Cluster, key: str) -> str | None:
    namespace, name = key.split("/")
    return (cluster.status("Agent", name, namespace).get("scheduling") or {}).get("model")


def triggered_by(cluster: Cluster, mark: int, trigger: str) -> set[str]:
    return {agent for agent, cause in cluster.reconciler.reconciled[mark:] if cause == trigger}


async def rebound(cluster: Cluster, mark: int, trigger: str, expected: set[str]) -> None:
    """Assert that ``trigger`` re-bound exactly ``expected`` (the reconciler's own record).

    First wait until the trigger's passes have recorded every expected Agent (a slow
    reconcile may still be on its way), then until the operator is idle, so that an Agent
    re-bound by mistake would be in the record by the time it is compared.
    """
    await eventually(lambda: triggered_by(cluster, mark, trigger) >= expected,
                     what=f"{trigger} re-binding {sorted(expected)}")
    await settle(cluster)
    assert triggered_by(cluster, mark, trigger) == expected


async def two_crews(cluster: Cluster, emulators: Emulators) -> None:
    """Crew q (qwen3 models on gpu-a) and crew p (phi3 models on gpu-b), all bound."""
    await cluster.apply(provider_manifest("gpu-a", emulators()))
    await cluster.apply(provider_manifest("gpu-b", emulators()))
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120,
                                labels={**TOOLS, "family": "qwen3", "params": "8B"}))
    await cluster.apply(b.model("phi3-mini", provider="gpu-b", vram_mib=2048,
                                labels={**TOOLS, "family": "phi3", "params": "3.8B"}))
    await cluster.apply(b.policy(
        "q-policy", Q, crew_ref="q",
        rules=[b.rule(phase, require={"family": "qwen3"}, prefer=[(100, {"params": "14B"})])
               for phase in ("mulling", "triage")],
    ))
    await cluster.apply(b.policy(
        "p-policy", P, crew_ref="p",
        rules=[b.rule(phase, require={"family": "phi3"}) for phase in ("mulling", "triage")],
    ))
    for namespace, name, crew in ((Q, "q1", "q"), (Q, "q2", "q"), (P, "p1", "p")):
        await cluster.apply(b.agent(name, namespace, crew=crew))
    await eventually(
        lambda: bound_model(cluster, "crew-q/q1") == "qwen3-8b"
        and bound_model(cluster, "crew-q/q2") == "qwen3-8b"
        and bound_model(cluster, "crew-p/p1") == "phi3-mini",
        what="both crews bound",
    )
    await settle(cluster)


async def test_operator_model_added_rebinds_exactly_the_affected_agents(
    cluster: Cluster, emulators: Emulators
) -> None:
    await two_crews(cluster, emulators)
    mark = len(cluster.reconciler.reconciled)
    untouched = cluster.versions("Agent", "p1", P)

    await cluster.apply(b.model("qwen3-14b", provider="gpu-a", vram_mib=9216,
                                labels={**TOOLS, "family": "qwen3", "params": "14B"}))
    await eventually(
        lambda: bound_model(cluster, "crew-q/q1") == "qwen3-14b"
        and bound_model(cluster, "crew-q/q2") == "qwen3-14b",
        what="crew q moved to the new Model",
    )
    await rebound(cluster, mark, "Model/qwen3-14b", {"crew-q/q1", "crew-q/q2"})
    assert cluster.versions("Agent", "p1", P) == untouched
    assert bound_model(cluster, "crew-p/p1") == "phi3-mini"


async def test_operator_provider_capacity_change_rechecks_its_agents_and_moves_none(
    cluster: Cluster, emulators: Emulators
) -> None:
    """A load changes what a probe sees, not what the Agents asked for (DESIGN §4
    "Stable bindings"): the provider's Agents are rechecked, their binding and its
    scores stay as written at bind time, and no Agent or Deployment is written."""
    await two_crews(cluster, emulators)
    mark = len(cluster.reconciler.reconciled)
    agents = {(ns, name): cluster.versions("Agent", name, ns)
              for ns, name in ((Q, "q1"), (Q, "q2"), (P, "p1"))}
    before = cluster.status("Agent", "p1", P)["scheduling"]["phases"]["mulling"]

    endpoint = cluster.get("ModelProvider", "gpu-b")["spec"]["endpoint"]
    emulator_b = emulators.at(endpoint)
    await preload(emulator_b, "phi3:mini")  # the card now holds the model: less free VRAM
    await cluster.operator.call(lambda: cluster.reconciler.probe("gpu-b"))

    loaded = await eventually(
        lambda: cluster.status("ModelProvider", "gpu-b")["capacity"]["loadedModels"],
        what="gpu-b reporting the load")
    assert [m["name"] for m in loaded] == ["phi3:mini"]
    await rebound(cluster, mark, "ModelProvider/gpu-b observed", {"crew-p/p1"})
    assert cluster.status("Agent", "p1", P)["scheduling"]["phases"]["mulling"] == before
    assert {key: cluster.versions("Agent", key[1], key[0]) for key in agents} == agents


async def test_operator_policy_edit_rebinds_only_its_crew(
    cluster: Cluster, emulators: Emulators
) -> None:
    await two_crews(cluster, emulators)
    mark = len(cluster.reconciler.reconciled)
    await cluster.patch("CrewSchedulingPolicy", "p-policy", {"spec": {"rules": [
        {"phase": "mulling", "require": {"matchLabels": {"family": "qwen3"}}},
    ]}}, namespace=P)
    await eventually(lambda: bound_model(cluster, "crew-p/p1") == "qwen3-8b",
                     what="p1 follows its edited policy")
    await rebound(cluster, mark, "CrewSchedulingPolicy/p-policy", {"crew-p/p1"})


async def test_operator_malformed_objects_get_conditions_and_events_not_crashes(
    cluster: Cluster, emulators: Emulators
) -> None:
    await cluster.apply(provider_manifest("gpu-a", emulators()))
    bad_policy: dict[str, Any] = b.policy("broken", Q, crew_ref="q").to_manifest()
    bad_policy["spec"]["rules"] = [{"phase": "mulling", "require": {"matchExpressions": [
        {"key": "params", "operator": "In"}]}}]
    await cluster.apply(bad_policy)
    bad_model = b.model("negative", provider="gpu-a").to_manifest()
    bad_model["spec"]["vramMib"] = -5
    await cluster.apply(bad_model)

    valid = await eventually(
        lambda: cluster.condition("CrewSchedulingPolicy", "broken", "Valid", Q))
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert "spec.rules[0].require.matchExpressions[0]" in valid["message"]
    assert "needs at least one value" in valid["message"]
    model = await eventually(lambda: cluster.condition("Model", "negative", "Valid"))
    assert model["status"] == "False" and "spec.vramMib" in model["message"]
    events = await eventually(lambda: len(cluster.events(reason="InvalidSpec")) >= 2
                              and cluster.events(reason="InvalidSpec"))
    assert {e["involvedObject"]["name"] for e in events} == {"broken", "negative"}

    # The operator still works: a good Model and an Agent are handled as usual.
    await cluster.apply(b.model("qwen3-8b", provider="gpu-a", vram_mib=5120,
                                labels={"params": "8B"}))
    await cluster.apply(b.agent("q1", Q, crew="q"))
    await eventually(lambda: bound_model(cluster, "crew-q/q1") == "qwen3-8b",
                     what="an Agent bound beside the broken objects")

    # Fixing the policy clears the condition and governs the Agent.
    await cluster.patch("CrewSchedulingPolicy", "broken", {"spec": {"rules": [
        {"phase": "mulling", "require": {"matchExpressions": [
            {"key": "params", "operator": "In", "values": ["8B"]}]}}]}}, namespace=Q)
    fixed = await eventually(
        lambda: cluster.condition("CrewSchedulingPolicy", "broken", "Valid", Q)
        .get("status") == "True")
    assert fixed
    policy_valid = await eventually(
        lambda: cluster.condition("CrewSchedulingPolicy", "broken", "Valid", Q))
    assert policy_valid["status"] == "True"
    await settle(cluster)
    assert len(cluster.events(reason="InvalidSpec")) == 2  # no repeats
