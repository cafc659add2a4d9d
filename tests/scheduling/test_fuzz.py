"""Fuzzed bundles: never a traceback, and the fast path always agrees with the engine.

The scheduler picks each binding by walking a cached ranking; the decision record is
rebuilt through the gates engine on demand. Both must tell the same story for any
cluster, so hypothesis builds random clusters and compares them phase by phase.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubemoot.api import InputError
from kubemoot.api.loader import load_bundle
from kubemoot.scheduling import schedule_bundle
from kubemoot.testing.builders import agent, model, policy, provider, rule, selector

from .conftest import NOW, assert_phases_agree_with_their_records, run

PROVIDERS = ("p0", "p1", "p2")
LABELS = st.fixed_dictionaries(
    {},
    optional={
        "capability/tool-calling": st.sampled_from(["true", "false"]),
        "latencyClass": st.sampled_from(["high", "medium", "low", "odd"]),
        "params": st.sampled_from(["8B", "14B", "32B"]),
    },
)


@st.composite
def a_provider(draw: st.DrawFn, name: str) -> Any:
    probed = draw(st.sampled_from([None, None, 10, 100, 400]))
    return provider(
        name,
        vram_total_mib=draw(st.sampled_from([None, 0, 8192, 32768, 49152, 49152, 49152])),
        vram_used_mib=draw(st.none() | st.integers(0, 49152)),
        ready=draw(st.sampled_from([True, True, True, True, False, None])),
        max_parallel=draw(st.sampled_from([None, 1, 1, 1, 2])),
        agent_count=draw(st.sampled_from([None, 0, 2, 3, 5, 9])),
        weight=draw(st.none() | st.sampled_from([25, 100])),
        last_probed_at=None if probed is None else NOW - timedelta(seconds=probed),
        loaded=draw(st.lists(st.sampled_from(["m:0", "m:1", "m:2"]), max_size=2, unique=True)),
        quarantined_digests=draw(st.lists(st.sampled_from(["sha256:a", "sha256:b"]), max_size=1)),
        **(
            {"policy": {"egress": draw(st.sampled_from(["none", "allowed"]))}}
            if draw(st.booleans())
            else {}
        ),
    )


@st.composite
def a_model(draw: st.DrawFn, index: int) -> Any:
    return model(
        f"m-{index}",
        model_id=f"m:{draw(st.integers(0, 2))}",
        provider=draw(st.sampled_from([*PROVIDERS, "missing"])),
        vram_mib=draw(st.sampled_from([None, 0, 5000, 9000, 9000, 20000, 40000])),
        labels=draw(LABELS),
        ready=draw(st.sampled_from([None, None, None, True, False])),
        license=draw(st.sampled_from([None, None, "ALLOW", "BLOCKED"])),
        egress=draw(st.sampled_from([None, None, None, "none"])),
        digest=draw(st.sampled_from([None, None, "sha256:a", "sha256:c"])),
    )


@st.composite
def a_policy(draw: st.DrawFn, crew: str) -> Any:
    rules = []
    for phase in draw(
        st.lists(st.sampled_from(["mulling", "triage", "bogus"]), max_size=3, unique=True)
    ):
        require = draw(
            st.none()
            | st.just(selector({"capability/tool-calling": "true"}))
            | st.just(selector({}, ("params", "In", ["14B", "32B"])))
            | st.just(selector({}, ("params", "NotIn", ["32B"])))
            | st.just(selector({}, ("capability/tool-calling", "DoesNotExist")))
        )
        prefer = draw(st.lists(st.tuples(st.integers(1, 100), LABELS.filter(bool)), max_size=2))
        rules.append(rule(phase, require=require, prefer=prefer))
    spread = draw(
        st.none()
        | st.sampled_from(
            [
                {"whenUnsatisfiable": "ScheduleAnyway", "phaseKeys": ["mulling", "triage"]},
                {"whenUnsatisfiable": "DoNotSchedule", "phaseKeys": ["mulling", "triage"]},
            ]
        )
    )
    bias = draw(
        st.dictionaries(
            st.sampled_from(["reasoning", "tool-calling", "default"]),
            st.sampled_from(["0.7", "0.3", "1", "x", "2"]),
            max_size=3,
        )
    )
    return policy(
        f"p-{crew}",
        crew_ref=crew,
        rules=rules,
        quality_bias=bias,
        spread=spread,
        max_age_seconds=draw(st.sampled_from([None, 60, 300])),
    )


@st.composite
def a_cluster(draw: st.DrawFn) -> dict[str, Any]:
    models = [draw(a_model(i)) for i in range(draw(st.integers(0, 6)))]
    providers = [draw(a_provider(name)) for name in PROVIDERS[: draw(st.integers(0, 3))]]
    crews = draw(st.lists(st.sampled_from(["c1", "c2"]), max_size=2, unique=True))
    policies = [draw(a_policy(crew)) for crew in crews]
    agents = [
        agent(
            f"a{i}",
            crew=draw(st.sampled_from([None, "c1", "c2"])),
            capabilities=draw(
                st.lists(
                    st.sampled_from(["reasoning", "tool-calling", "k8s"]), max_size=2, unique=True
                )
            ),
        )
        for i in range(draw(st.integers(0, 9)))
    ]
    return {"models": models, "providers": providers, "policies": policies, "agents": agents}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a_cluster())
def test_fast_path_agrees_with_the_engine(cluster: dict[str, Any]) -> None:
    result = run(**cluster)
    assert len(result.agents) == len(cluster["agents"])
    assert_phases_agree_with_their_records(result)
    result.to_dict()  # renders without error


VALID = [
    {
        "apiVersion": "kubemoot.ai/v1alpha1",
        "kind": "ModelProvider",
        "metadata": {"name": "gpu"},
        "spec": {"endpoint": "http://gpu:11434"},
        "status": {"ready": True, "capacity": {"vramTotalMiB": 32768, "maxParallel": 1}},
    },
    {
        "apiVersion": "kubemoot.ai/v1alpha1",
        "kind": "Model",
        "metadata": {"name": "m-8b", "labels": {"latencyClass": "low"}},
        "spec": {"model": "m:8b", "providerRef": "gpu", "vramMib": 5000},
    },
    {
        "apiVersion": "kubemoot.ai/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "a", "namespace": "crew-a"},
        "spec": {"capabilities": ["reasoning"]},
    },
    {
        "apiVersion": "kubemoot.ai/v1alpha1",
        "kind": "CrewSchedulingPolicy",
        "metadata": {"name": "p", "namespace": "crew-a"},
        "spec": {"qualityBias": {"reasoning": "0.7"}, "rules": [{"phase": "mulling"}]},
    },
]
JUNK = st.none() | st.integers(-5, 5) | st.text(max_size=6) | st.lists(st.integers(), max_size=2)


def _mutate(document: Any, path: list[int], value: Any) -> Any:
    """Replace one nested value chosen by ``path`` (indices into sorted keys)."""
    if not isinstance(document, dict) or not path or not document:
        return value
    keys = sorted(document)
    key = keys[path[0] % len(keys)]
    return {**document, key: _mutate(document[key], path[1:], value)}


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    which=st.integers(0, len(VALID) - 1),
    path=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    value=JUNK,
)
def test_broken_bundles_raise_input_error_only(
    tmp_path: Path, which: int, path: list[int], value: Any
) -> None:
    documents = list(VALID)
    documents[which] = _mutate(documents[which], path, value)
    file = tmp_path / "bundle.yaml"
    file.write_text(yaml.safe_dump_all(documents))
    try:
        result = schedule_bundle(load_bundle([file]), now=NOW)
    except InputError as error:
        assert error.describe()
    else:
        result.to_dict()
