"""The test builders, and agreement between the models and the generated CRD schemas."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import kubemoot.api
from kubemoot.api import CREW_LABEL, Resource, validate_against_crd
from kubemoot.testing.builders import agent, archetype, model, policy, provider, rule, selector

NOW = datetime(2026, 5, 15, 12, 0, tzinfo=UTC)

BUILT: list[Resource] = [
    model("qwen3-32b", vram_mib=20480, labels={"params": "32B"}, license="ALLOW"),
    model("phi3-mini", provider="cpu-ollama", ready=False),
    provider("ollama-a", vram_total_mib=32768, loaded=[("qwen3:32b", 18432, 8192)], weight=25,
             last_probed_at=NOW, reserve_mib=2048, context_length=8192),
    provider("ollama-b", ready=None, max_parallel=None, agent_count=None),
    agent("kubectl-agent", capabilities=["tool-calling"], crew="homelab"),
    policy(
        "default",
        crew_ref="homelab",
        rules=[
            rule("mulling", require=selector({"capability/tool-calling": "true"},
                                             ("params", "In", ["14B", "32B"])),
                 prefer=[(100, {"params": "32B"}), (50, {"params": "14B"})]),
            rule("triage"),
        ],
        quality_bias={"reasoning": "0.7"},
        spread=["mulling", "triage"],
        max_age_seconds=60,
    ),
    archetype(),
]


def test_builders_fill_what_they_promise() -> None:
    m, phi, a, b, ag, pol, arch = BUILT
    assert (m.spec.model, m.spec.provider_ref, m.spec.vram_mib) == ("qwen3:32b", "ollama-a", 20480)
    assert phi.spec.model == "phi3:mini" and phi.is_ready is False
    assert a.capacity is not None
    assert a.capacity.loaded_model_footprints == {"qwen3:32b": 18432}
    assert a.capacity.loaded_models[0].context_length == 8192
    assert a.spec.scheduling.weight == 25 and a.spec.reserve_mib == 2048
    assert a.status is not None and a.status.last_probed_at == NOW
    assert b.capacity is not None and b.capacity.vram_total_mib is None
    assert ag.metadata.labels[CREW_LABEL] == "homelab" and ag.namespace == "crew-a"
    assert pol.spec.topology_spread is not None
    assert pol.spec.topology_spread.phase_keys == ["mulling", "triage"]
    assert pol.spec.freshness.max_age_seconds == 60
    assert pol.spec.rules[1].require is None
    assert arch.phase_names == ["mulling", "triage"]


@pytest.mark.parametrize("resource", BUILT, ids=lambda r: r.key)
def test_every_model_dump_conforms_to_its_crd(resource: Resource) -> None:
    assert validate_against_crd(resource.to_manifest()) == []


def test_public_api_exports_resolve() -> None:
    missing = [name for name in kubemoot.api.__all__ if not hasattr(kubemoot.api, name)]
    assert missing == []
    for name in ("Model", "ModelProvider", "Agent", "CrewSchedulingPolicy", "MootArchetype",
                 "KubemootConfig", "LabelSelector", "selector_matches", "load_bundle",
                 "crd_manifests", "validate_against_crd", "InputError"):
        assert name in kubemoot.api.__all__
