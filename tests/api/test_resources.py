"""The resource models: the spec's examples round-trip, defaults, keys and field errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kubemoot.api import (
    RESOURCE_TYPES,
    Agent,
    CrewSchedulingPolicy,
    KubemootConfig,
    Model,
    ModelProvider,
    MootArchetype,
    SchedulingRule,
)

FIXTURES = Path(__file__).parent / "fixtures"
MODEL_SPEC = {"model": "a", "providerRef": "p"}
EXAMPLES = ["spec-examples.yaml", "quality-bias.yaml", "prod-bundle.yaml"]


def documents() -> list[dict[str, Any]]:
    found = []
    for name in EXAMPLES:
        for data in yaml.safe_load_all((FIXTURES / name).read_text()):
            if data and data["apiVersion"] == "kubemoot.ai/v1alpha1":
                found.append(data)
    return found


@pytest.mark.parametrize("data", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_spec_examples_round_trip(data: dict[str, Any]) -> None:
    cls = RESOURCE_TYPES[data["kind"]]
    resource = cls.model_validate(data)
    # What the user wrote comes back unchanged ...
    assert resource.model_dump(mode="json", by_alias=True, exclude_unset=True) == data
    # ... and the full dump (defaults included) parses to the same object.
    dumped = resource.model_dump(by_alias=True, exclude_none=True)
    assert cls.model_validate(dumped) == resource
    assert cls.model_validate(yaml.safe_load(yaml.safe_dump(dumped))) == resource


def test_spec_values_are_read() -> None:
    by_kind = {data["kind"]: data for data in documents()[:4]}
    model = Model.model_validate(by_kind["Model"])
    assert (model.spec.model, model.spec.provider_ref, model.spec.vram_mib) == (
        "qwen3:32b",
        "ollama-a",
        20480,
    )
    assert model.labels["capability/tool-calling"] == "true"
    assert model.is_ready  # no status: taken as Ready
    provider = ModelProvider.model_validate(by_kind["ModelProvider"])
    assert provider.spec.reserve_mib == 1024
    assert provider.spec.scheduling.weight == 100
    assert provider.capacity is not None
    assert provider.capacity.vram_total_mib == 32768
    assert provider.capacity.loaded_models[0].size_mib == 18432
    policy = CrewSchedulingPolicy.model_validate(by_kind["CrewSchedulingPolicy"])
    assert policy.spec.freshness.max_age_seconds == 120
    mulling = policy.spec.rule_for("mulling")
    assert mulling is not None and mulling.require is not None
    assert mulling.require.describe() == "{capability/tool-calling: true, params: 14B|32B}"
    assert [term.weight for term in mulling.prefer] == [100, 50]
    assert policy.spec.topology_spread is not None
    assert policy.spec.topology_spread.phase_keys == ["mulling", "triage"]
    agent = Agent.model_validate(by_kind["Agent"])
    assert agent.status is not None and agent.status.scheduling is not None
    assert agent.status.scheduling.last_unschedulable is not None
    assert agent.status.scheduling.last_unschedulable.observed_at is not None


@pytest.mark.parametrize(
    ("resource", "key", "namespace"),
    [
        (Model.model_validate({"metadata": {"name": "m"}, "spec": MODEL_SPEC}), "Model/m", None),
        (Agent.model_validate({"metadata": {"name": "a", "namespace": "crew-a"}}),
         "Agent/crew-a/a", "crew-a"),
        (Agent.model_validate({"metadata": {"name": "a"}}), "Agent/default/a", "default"),
        (KubemootConfig.defaults(), "KubemootConfig/default", None),
    ],
)
def test_keys_and_scope(resource: Any, key: str, namespace: str | None) -> None:
    assert resource.key == key
    assert resource.namespace == namespace


@pytest.mark.parametrize(
    ("cls", "data", "loc", "message"),
    [
        (Model, {"metadata": {"name": "m"}, "spec": {**MODEL_SPEC, "vramMB": 1}},
         ("spec", "vramMB"), "Extra inputs"),
        (Model, {"metadata": {"name": "m"}, "spec": {"model": "a"}}, ("spec", "providerRef"),
         "Field required"),
        (Model, {"metadata": {"name": "qwen3:32b"}, "spec": {"model": "a", "providerRef": "p"}},
         ("metadata", "name"), "invalid name"),
        (Model, {"metadata": {"name": "m"}, "spec": {"model": "a", "providerRef": "p",
                                                     "license": "MAYBE"}},
         ("spec", "license"), "ALLOW"),
        (ModelProvider, {"metadata": {"name": "p"}, "spec": {"endpoint": "e"},
                         "status": {"capacity": {"vramTotalMB": 1}}},
         ("status", "capacity", "vramTotalMB"), "Extra inputs"),
        (ModelProvider, {"metadata": {"name": "p"}, "spec": {"endpoint": "e"},
                         "status": {"lastProbedAt": "2026-05-15T12:00:00"}},
         ("status", "lastProbedAt"), "timezone"),
        (CrewSchedulingPolicy, {"metadata": {"name": "c"},
                                "spec": {"rules": [{"phase": "m", "prefer": [
                                    {"weight": 0, "selector": {}}]}]}},
         ("spec", "rules", 0, "prefer", 0, "weight"), "greater than or equal to 1"),
        (CrewSchedulingPolicy, {"metadata": {"name": "c"},
                                "spec": {"topologySpread": {"whenUnsatisfiable": "Never"}}},
         ("spec", "topologySpread", "whenUnsatisfiable"), "ScheduleAnyway"),
        (KubemootConfig, {"metadata": {"name": "k"}, "spec": {"scheduler": {"strategy": "pack"}}},
         ("spec", "scheduler", "strategy"), "spread"),
        (MootArchetype, {"metadata": {"name": "a"}, "spec": {"phases": [{"name": "x"},
                                                                      {"name": "x"}]}},
         ("spec", "phases"), 'phase "x" is declared more than once'),
        (Agent, {"metadata": {"name": "a", "namespace": "Crew_A"}}, ("metadata", "namespace"),
         "invalid namespace"),
        (Agent, {"metadata": {"name": "a"}, "status": {"scheduling": {"modle": "x"}}},
         ("status", "scheduling", "modle"), "Extra inputs"),
        (Agent, {"apiVersion": "kubemoot.ai/v2", "metadata": {"name": "a"}}, ("apiVersion",),
         "kubemoot.ai/v1alpha1"),
    ],
)
def test_invalid_fields_are_named(
    cls: Any, data: dict[str, Any], loc: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        cls.model_validate(data)
    first = caught.value.errors()[0]
    assert first["loc"] == loc
    assert message in first["msg"]


def test_agent_spec_keeps_runtime_fields() -> None:
    data = {"metadata": {"name": "a"}, "spec": {"capabilities": ["x"], "temperature": 0.2}}
    agent = Agent.model_validate(data)
    assert agent.spec_extras() == {"temperature": 0.2}
    assert agent.model_dump(by_alias=True, exclude_unset=True)["spec"]["temperature"] == 0.2


@pytest.mark.parametrize(("typo", "meant"), [("capabilites", "capabilities"),
                                             ("discusRole", "discussRole"),
                                             ("enabledTool", "enabledTools")])
def test_agent_spec_refuses_a_misspelt_field_of_ours(typo: str, meant: str) -> None:
    """A misspelt ``capabilities`` was kept as a runtime field, and the Agent was
    scheduled with no capabilities without a word."""
    data = {"metadata": {"name": "a"}, "spec": {typo: ["x"]}}
    with pytest.raises(ValidationError) as caught:
        Agent.model_validate(data)
    first = caught.value.errors()[0]
    assert first["loc"] == ("spec",)
    assert f'unknown field "{typo}"; did you mean "{meant}"?' in first["msg"]


@pytest.mark.parametrize(("raw", "kept"), [("0.7", "0.7"), (0.7, "0.7"), (1, "1"), ("x", "x")])
def test_quality_bias_values_stay_text(raw: Any, kept: str) -> None:
    policy = CrewSchedulingPolicy.model_validate(
        {"metadata": {"name": "c"}, "spec": {"qualityBias": {"reasoning": raw}}}
    )
    assert policy.spec.quality_bias == {"reasoning": kept}


@pytest.mark.parametrize(
    ("rule", "labels", "admitted"),
    [
        ({"phase": "m"}, {}, True),  # no require written: nothing required
        ({"phase": "m", "require": {}}, {}, True),
        ({"phase": "m", "require": {"matchLabels": {"a": "b"}}}, {"a": "c"}, False),
    ],
)
def test_rule_admits(rule: dict[str, Any], labels: dict[str, str], admitted: bool) -> None:
    assert SchedulingRule.model_validate(rule).admits(labels) is admitted


def test_snake_case_names_are_accepted() -> None:
    model = Model.model_validate(
        {"metadata": {"name": "m"}, "spec": {"model": "a", "provider_ref": "p", "vram_mib": 5}}
    )
    assert model.to_manifest()["spec"] == {"model": "a", "providerRef": "p", "vramMib": 5}


def test_model_readiness_from_status() -> None:
    base = {"metadata": {"name": "m"}, "spec": {"model": "a", "providerRef": "p"}}
    assert Model.model_validate({**base, "status": {"ready": False}}).is_ready is False
    assert Model.model_validate({**base, "status": {}}).is_ready is True


@pytest.mark.parametrize("spelling", ["vramMib", "vramMiB"])
def test_mebibyte_fields_take_either_spelling(spelling: str) -> None:
    model = Model.model_validate({"metadata": {"name": "m"},
                                  "spec": {**MODEL_SPEC, spelling: 512}})
    provider = ModelProvider.model_validate({
        "metadata": {"name": "p"}, "spec": {"endpoint": "e", "reserveMib": 256},
        "status": {"capacity": {"vramTotalMib": 8192}}})
    assert model.spec.vram_mib == 512
    assert provider.spec.reserve_mib == 256 and provider.capacity is not None
    assert provider.capacity.vram_total_mib == 8192


def test_both_spellings_at_once_are_refused() -> None:
    with pytest.raises(ValidationError, match="vramMiB and vramMib are one field"):
        Model.model_validate({"metadata": {"name": "m"},
                              "spec": {**MODEL_SPEC, "vramMiB": 1, "vramMib": 2}})
