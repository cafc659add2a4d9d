"""The operator's pure parts: status diffs, conditions, env templating, who is affected."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.api import Agent, InputError, Model, ModelProvider
from kubemoot.clock import ManualClock
from kubemoot.operator.deployment import deployment_name, env_patch
from kubemoot.operator.probe import VRAM_TOTAL_ANNOTATION, client_for, model_status, provider_status
from kubemoot.operator.status import condition, merge_conditions, merge_patch, rfc3339
from kubemoot.operator.view import (
    ClusterView,
    affected_by_archetype,
    affected_by_models,
    affected_by_policies,
    affected_by_provider,
)
from kubemoot.scheduling.snapshot import ClusterSnapshot
from kubemoot.store.documents import ProviderState
from kubemoot.testing import builders as b
from kubemoot.testing.state import provider_state

NOW = datetime(2026, 5, 15, 12, 0, tzinfo=UTC)
LATER = datetime(2026, 5, 15, 12, 5, tzinfo=UTC)


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 applied, as the API server applies it."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


# ---------------------------------------------------------------------------- status diffs

@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"a": 1}, {"a": 1}, {}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({}, {"a": {"b": 1}}, {"a": {"b": 1}}),
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}}, {"a": {"c": 3}}),
        ({"a": [1, 2]}, {"a": [1]}, {"a": [1]}),
        ({"a": 1}, {"a": 1, "b": None}, {}),
        ({"a": {"x": 1}}, {"a": 5}, {"a": 5}),
    ],
)
def test_operator_merge_patch_table(old: dict[str, Any], new: dict[str, Any],
                                    patch: dict[str, Any]) -> None:
    assert merge_patch(old, new) == patch


_json = st.recursive(
    st.one_of(st.integers(-3, 3), st.text(max_size=3), st.booleans()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from("abcd"), inner, max_size=3),
    ),
    max_leaves=12,
)
_docs = st.dictionaries(st.sampled_from("abcde"), _json, max_size=4)


@settings(max_examples=150, deadline=None)
@given(old=_docs, new=_docs)
def test_operator_merge_patch_applied_gives_the_new_status(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    patch = merge_patch(old, new)
    assert apply_merge_patch(old, patch) == new
    assert (patch == {}) == (old == new)


def test_operator_merge_conditions_keeps_transition_time_while_status_holds() -> None:
    old = [condition("Ready", True, "ProbeSucceeded", "ok", now=NOW),
           condition("Other", True, "X", "kept", now=NOW)]
    same = merge_conditions(old, [condition("Ready", True, "ProbeSucceeded", "still", now=LATER)])
    assert same[0]["lastTransitionTime"] == rfc3339(NOW)
    assert same[0]["message"] == "still"
    assert same[1] == old[1]
    flipped = merge_conditions(old, [condition("Ready", False, "ProbeFailed", "down", now=LATER)])
    assert flipped[0]["lastTransitionTime"] == rfc3339(LATER)
    added = merge_conditions(old, [condition("New", True, "Y", "z", now=LATER)])
    assert [c["type"] for c in added] == ["Ready", "Other", "New"]


# ---------------------------------------------------------------------------- Deployment env

def _deployment(*containers: dict[str, Any], version: str | None = "7") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "d", "namespace": "crew-a"}
    if version:
        meta["resourceVersion"] = version
    return {"metadata": meta, "spec": {"template": {"spec": {"containers": list(containers)}}}}


ENV = {"KUBEMOOT_MODEL_MODEL": "qwen3:32b", "KUBEMOOT_MODEL_ENDPOINT": "http://a:11434"}


@pytest.mark.parametrize(
    ("containers", "index", "expected_env"),
    [
        # the container named "agent" gets the env; the crew's own entries stay first
        ([{"name": "side"}, {"name": "agent", "env": [{"name": "KEEP", "value": "1"}]}], 1,
         [{"name": "KEEP", "value": "1"},
          {"name": "KUBEMOOT_MODEL_ENDPOINT", "value": "http://a:11434"},
          {"name": "KUBEMOOT_MODEL_MODEL", "value": "qwen3:32b"}]),
        # no container named agent: the first one
        ([{"name": "main"}], 0,
         [{"name": "KUBEMOOT_MODEL_ENDPOINT", "value": "http://a:11434"},
          {"name": "KUBEMOOT_MODEL_MODEL", "value": "qwen3:32b"}]),
        # an outdated value and a valueFrom are replaced in place
        ([{"name": "agent", "env": [
            {"name": "KUBEMOOT_MODEL_MODEL", "value": "old"},
            {"name": "KUBEMOOT_MODEL_ENDPOINT", "valueFrom": {"configMapKeyRef": {}}}]}], 0,
         [{"name": "KUBEMOOT_MODEL_MODEL", "value": "qwen3:32b"},
          {"name": "KUBEMOOT_MODEL_ENDPOINT", "value": "http://a:11434"}]),
    ],
)
def test_operator_env_patch_table(containers: list[dict[str, Any]], index: int,
                                  expected_env: list[dict[str, str]]) -> None:
    patch = env_patch(_deployment(*containers), ENV)
    assert patch is not None
    patched = patch["spec"]["template"]["spec"]["containers"]
    assert len(patched) == len(containers)
    assert patched[index]["env"] == expected_env
    for other, original in zip(patched, containers, strict=True):
        if other is not patched[index]:
            assert other == original
    assert patch["metadata"] == {"resourceVersion": "7"}


def test_operator_env_patch_is_none_when_the_env_already_matches() -> None:
    env = [{"name": key, "value": value} for key, value in sorted(ENV.items())]
    assert env_patch(_deployment({"name": "agent", "env": env}), ENV) is None


def test_operator_env_patch_without_containers_is_an_error() -> None:
    with pytest.raises(ValueError, match="no containers"):
        env_patch(_deployment(), ENV)


def test_operator_deployment_name_defaults_to_the_agent() -> None:
    assert deployment_name(b.agent("kubectl-agent")) == "kubectl-agent"
    assert deployment_name(b.agent("kubectl-agent", deploymentRef="crew-tools")) == "crew-tools"


# ---------------------------------------------------------------------------- probe → status

def _state(**overrides: Any) -> ProviderState:
    """gpu-a with qwen3:8b resident and two models on disk (kubemoot.testing.state)."""
    fields: dict[str, Any] = {
        "endpoint": "http://a:11434", "probed_at": NOW.timestamp(), "used_vram_mib": 5000,
        "slots": 2, "context": 8192, "loaded": {"qwen3:8b": 5000},
        "digests": {"qwen3:8b": "sha256:1"}, "loaded_model_footprints": {"qwen3:8b": 5000},
        "disk_sizes_mib": {"qwen3:8b": 4800, "qwen3:14b": 9000},
    }
    fields.update(overrides)
    return provider_state("gpu-a", **fields)


def test_operator_provider_status_from_a_probe_keeps_a_declared_total() -> None:
    provider = b.provider("gpu-a", vram_total_mib=32768)
    status = provider_status(_state(), provider, agent_count=3, now=NOW)
    capacity = status["capacity"]
    assert status["ready"] is True and status["lastProbedAt"] == "2026-05-15T12:00:00Z"
    assert capacity["vramTotalMiB"] == 32768  # Ollama cannot say; the declared one stays
    assert capacity["agentCount"] == 3 and capacity["maxParallel"] == 2
    assert capacity["loadedModels"] == [{"name": "qwen3:8b", "sizeMiB": 5000,
                                         "digest": "sha256:1"}]
    assert capacity["digests"] == ["sha256:1"]
    assert status["conditions"][0]["reason"] == "ProbeSucceeded"
    ModelProvider.model_validate({**provider.to_manifest(), "status": status})


def test_operator_provider_status_of_a_failed_probe() -> None:
    state = _state(ready=False, reason="cannot connect", loaded={})
    status = provider_status(state, b.provider("gpu-a"), agent_count=0, now=NOW)
    assert status["ready"] is False
    assert (status["conditions"][0]["status"], status["conditions"][0]["message"]) == (
        "False", "cannot connect")


@pytest.mark.parametrize(
    ("model_id", "state", "known", "ready", "reason"),
    [
        ("qwen3:8b", _state(), True, True, "Available"),
        ("qwen3:14b", _state(), True, True, "Available"),  # pulled, not loaded
        ("llama3:70b", _state(), True, False, "NotAvailable"),
        ("qwen3:8b", _state(ready=False, reason="down"), True, False, "ProviderNotReady"),
        ("qwen3:8b", None, False, False, "ProviderNotFound"),
    ],
)
def test_operator_model_status_table(model_id: str, state: ProviderState | None, known: bool,
                                     ready: bool, reason: str) -> None:
    model = b.model("m", model_id=model_id, provider="gpu-a")
    status = model_status(model, state, provider_known=known, now=NOW)
    assert status is not None
    assert (status["ready"], status["conditions"][0]["reason"]) == (ready, reason)
    Model.model_validate({**model.to_manifest(), "status": status})


def test_operator_model_status_waits_for_the_first_probe() -> None:
    assert model_status(b.model("m"), None, provider_known=True, now=NOW) is None


@pytest.mark.parametrize("value", ["lots", "0", "-1"])
def test_operator_bad_vram_annotation_names_the_field(value: str) -> None:
    provider = ModelProvider.model_validate({
        **b.provider("gpu-a").to_manifest(),
        "metadata": {"name": "gpu-a", "annotations": {VRAM_TOTAL_ANNOTATION: value}},
    })
    with pytest.raises(InputError) as caught:
        client_for(provider, clock=ManualClock(0.0), timeout=1.0)
    assert caught.value.field == f"metadata.annotations[{VRAM_TOTAL_ANNOTATION}]"


def test_operator_probe_timeout_bounds_the_whole_probe() -> None:
    # --probe-timeout is the whole call's deadline, not a per-read limit that a server
    # dripping bytes could stretch (the default deadline is minutes).
    client = client_for(b.provider("gpu-a"), clock=ManualClock(0.0), timeout=7.0)
    assert client.deadline == 7.0


# ---------------------------------------------------------------------------- who is affected

def _cluster() -> ClusterSnapshot:
    qwen = {"family": "qwen3"}
    phi = {"family": "phi3"}
    return ClusterSnapshot.build(
        models=[b.model("qwen3-8b", provider="gpu-a", labels=qwen),
                b.model("phi3-mini", provider="gpu-b", labels=phi)],
        providers=[b.provider("gpu-a"), b.provider("gpu-b")],
        agents=[b.agent("q1", "crew-q", crew="q"), b.agent("q2", "crew-q", crew="q"),
                b.agent("p1", "crew-p", crew="p"), b.agent("free", "crew-x"),
                b.agent("other", "crew-q", crew="other")],
        policies=[b.policy("qp", "crew-q", crew_ref="q",
                           rules=[b.rule(p, require=qwen) for p in ("mulling", "triage")]),
                  b.policy("pp", "crew-p", crew_ref="p", archetype_ref="custom",
                           rules=[b.rule("mulling", require=phi)])],
        archetypes=[b.archetype("custom", phases=["mulling"])],
    )


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        # crew q requires qwen3; agents without a policy take every model
        ({"family": "qwen3"}, {"crew-q/q1", "crew-q/q2", "crew-x/free", "crew-q/other"}),
        ({"family": "phi3"}, {"crew-p/p1", "crew-x/free", "crew-q/other"}),
        ({"family": "llama"}, {"crew-x/free", "crew-q/other"}),
    ],
)
def test_operator_affected_by_a_model_table(labels: dict[str, str], expected: set[str]) -> None:
    model = b.model("new", provider="gpu-a", labels=labels)
    assert affected_by_models(_cluster(), [model]) == expected


def test_operator_affected_by_a_model_includes_agents_it_was_bound_to() -> None:
    snapshot = _cluster()
    bound = Agent.model_validate({**b.agent("p2", "crew-p", crew="p").to_manifest(), "status": {
        "scheduling": {"phases": {"mulling": {"model": "gone", "provider": "gpu-a"}}}}})
    snapshot = ClusterSnapshot.build(models=snapshot.models, providers=snapshot.providers.values(),
                                     agents=[*snapshot.agents, bound],
                                     policies=snapshot.policies)
    gone = b.model("gone", provider="gpu-a", labels={"family": "llama"})
    assert "crew-p/p2" in affected_by_models(snapshot, [gone])
    assert "crew-p/p2" in affected_by_provider(snapshot, "gpu-a", [])


def test_operator_affected_by_provider_policy_and_archetype() -> None:
    snapshot = _cluster()
    models = list(snapshot.models)
    assert affected_by_provider(snapshot, "gpu-b", models) == {
        "crew-p/p1", "crew-x/free", "crew-q/other"}
    assert affected_by_policies(snapshot, [snapshot.policies[0]]) == {"crew-q/q1", "crew-q/q2"}
    assert affected_by_archetype(snapshot, "custom") == {"crew-p/p1"}
    assert affected_by_archetype(snapshot, "consent-3") == {
        "crew-q/q1", "crew-q/q2", "crew-x/free", "crew-q/other"}


def test_operator_agent_counts_leave_out_the_agents_being_scheduled() -> None:
    def bound(name: str, provider: str) -> Agent:
        return Agent.model_validate({**b.agent(name).to_manifest(), "status": {"scheduling": {
            "phases": {"mulling": {"provider": provider}, "triage": {"provider": provider}}}}})

    view = ClusterView(agents={"crew-a/x": bound("x", "gpu-a"), "crew-a/y": bound("y", "gpu-a"),
                               "crew-a/z": bound("z", "gpu-b")},
                       providers={"gpu-a": b.provider("gpu-a", agent_count=9)})
    assert view.agent_counts() == {"gpu-a": 2, "gpu-b": 1}
    assert view.agent_counts(exclude={"crew-a/x"}) == {"gpu-a": 1, "gpu-b": 1}
    snapshot = view.snapshot(exclude={"crew-a/x"})
    capacity = snapshot.providers["gpu-a"].capacity
    assert capacity is not None and capacity.agent_count == 1  # ours, not the stored 9


@pytest.mark.parametrize("encode", [True, False])
def test_operator_kubeconfig_pem_data_is_decoded(encode: bool) -> None:
    import base64

    from kubemoot.operator.kube import _pem

    pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    data = base64.b64encode(pem).decode() if encode else pem.decode()
    assert _pem(data) == pem
