"""The pass shares work between Agents; each Agent's answer must stay its own.

Agents with one policy and one effective bias share a binding group; rule tables and
rankings are shared between policies that rank alike; a few gates remember a provider's
verdict. These tests pin down that sharing never leaks between Agents or providers.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.gates import GateResult, Outcome, Verdict
from kubemoot.scheduling import SchedulingPass, effective_bias
from kubemoot.scheduling.bias import BiasTable
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins import FreshnessGate, ProviderReadyGate, VramGate
from kubemoot.scheduling.snapshot import ClusterSnapshot
from kubemoot.testing.builders import agent, model, policy, provider, rule

from .conftest import NOW, run

TOOLS = {"capability/tool-calling": "true"}


def _crew_on_two_providers(agents: int) -> dict[str, Any]:
    # gpu-a scores higher (larger card, more free VRAM) and takes 4 agents (1 slot × 4).
    return {
        "models": [
            model("m-a", model_id="m:a", provider="gpu-a", vram_mib=5000, labels=TOOLS),
            model("m-b", model_id="m:b", provider="gpu-b", vram_mib=5000, labels=TOOLS),
        ],
        "providers": [
            provider("gpu-a", vram_total_mib=49152, max_parallel=1),
            provider("gpu-b", vram_total_mib=32768, max_parallel=8),
        ],
        "agents": [agent(f"a{i}", crew="crew") for i in range(agents)],
        "policies": [policy("p", crew_ref="crew", rules=[rule("mulling", require=TOOLS)])],
    }


def test_a_group_moves_on_when_the_provider_it_binds_fills_up() -> None:
    result = run(**_crew_on_two_providers(6))
    bound = [a.phases["mulling"].provider for a in result.agents]
    assert bound == ["gpu-a"] * 4 + ["gpu-b"] * 2
    for index, scheduled in enumerate(result.agents):
        phase = scheduled.phases["mulling"]
        record = phase.decision
        assert record.chosen == phase.model
        # The record replays exactly the bindings made before this Agent.
        gates = record.candidates["m-a"].gates
        parallelism = next(result for result in gates if result.gate == "Parallelism")
        assert parallelism.evidence["assumedInPass"] == min(index, 4)
        assert parallelism.result is (Verdict.PASS if index < 4 else Verdict.FAIL)


def test_each_agent_owns_its_result_objects() -> None:
    first, second = run(**_crew_on_two_providers(2)).agents
    first.env["EXTRA"] = "1"
    first.conditions[0].message = "changed"
    assert "EXTRA" not in second.env
    assert second.conditions[0].message != "changed"
    assert first.phases["mulling"] is not second.phases["mulling"]
    assert first.phases["mulling"].decision.subject != second.phases["mulling"].decision.subject
    assert first.env is first.env  # built once, then kept


def test_policies_that_rank_alike_share_work_but_not_answers() -> None:
    models = [
        model("m-8b", provider="gpu", vram_mib=5000, labels={**TOOLS, "p": "8"}),
        model("m-14b", provider="gpu", vram_mib=9000, labels={**TOOLS, "p": "14"}),
    ]

    def preferring(params: str) -> list[Any]:
        return [rule("mulling", require=TOOLS, prefer=[(50, {"p": params})])]

    policies = [
        policy("same-1", "ns-1", rules=preferring("14")),
        policy("same-2", "ns-2", rules=preferring("14")),
        policy("other", "ns-3", rules=preferring("8")),
    ]
    snapshot = ClusterSnapshot.build(
        models=models,
        providers=[provider("gpu", vram_total_mib=32768, max_parallel=4)],
        policies=policies,
    )
    scheduling = SchedulingPass(snapshot, now=NOW)
    results = [scheduling.schedule(agent("a", ns)) for ns in ("ns-1", "ns-2", "ns-3")]
    chosen = [r.phases["mulling"].model for r in results]
    assert chosen == ["m-14b", "m-14b", "m-8b"]
    assert [r.policy.metadata.name for r in results if r.policy] == ["same-1", "same-2", "other"]
    assert results[0].phases["mulling"].candidates == results[1].phases["mulling"].candidates
    assert results[2].phases["mulling"].candidates[0] == ("m:8b", 50.0)
    for scheduled in results:
        assert scheduled.phases["mulling"].decision.chosen == scheduled.phases["mulling"].model


def test_an_unplaced_group_is_decided_again_after_a_provider_fills() -> None:
    cluster = _crew_on_two_providers(0)
    cluster["providers"][1] = provider("gpu-b", vram_total_mib=None, max_parallel=8)
    cluster["agents"] = [agent(f"a{i}", crew="crew") for i in range(6)]
    result = run(**cluster)
    outcomes = [a.phases["mulling"].outcome for a in result.agents]
    assert outcomes == [Outcome.PLACE] * 4 + [Outcome.DEFER] * 2
    for scheduled in result.agents:
        phase = scheduled.phases["mulling"]
        assert phase.decision.outcome is phase.outcome
    assert "gpu-b" in result.agents[-1].phases["mulling"].reason


@settings(max_examples=150, deadline=None)
@given(
    quality_bias=st.dictionaries(
        st.sampled_from(["reasoning", "coding", "tool-calling", "default"]),
        st.sampled_from(["0", "0.3", "0.7", "1", "1.5", "x", " 0.5 ", "nan"]),
        max_size=4,
    ),
    capabilities=st.lists(
        st.sampled_from(["reasoning", "coding", "tool-calling", "default", "k8s"]), max_size=4
    ),
)
def test_the_parsed_bias_table_agrees_with_effective_bias(
    quality_bias: dict[str, str], capabilities: list[str]
) -> None:
    expected = effective_bias(quality_bias, capabilities)
    assert BiasTable(quality_bias).effective(capabilities) == expected


def test_gates_that_remember_a_provider_keep_providers_apart() -> None:
    ready = provider("up", ready=True, last_probed_at=NOW)
    down = provider("down", ready=False, last_probed_at=NOW.replace(year=2025))
    readiness = ProviderReadyGate(now=NOW, max_age_seconds=120)
    freshness = FreshnessGate(now=NOW, max_age_seconds=120)
    on_up = Placement(model("m-1", provider="up"), ready)
    on_down = Placement(model("m-2", provider="down"), down)
    missing = Placement(model("m-3", provider="gone"), None)
    assert [readiness.check(p).result for p in (on_up, on_down, on_up, missing)] == [
        Verdict.PASS,
        Verdict.STALE,
        Verdict.PASS,
        Verdict.FAIL,
    ]
    assert [freshness.check(p).result for p in (on_down, on_up, on_down)] == [
        Verdict.STALE,
        Verdict.PASS,
        Verdict.STALE,
    ]


def test_provider_gate_results_are_made_only_when_a_record_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pass judges every Model's provider-tier gates (verdicts only); a result with its
    # reason and evidence is made when a decision record or a message needs it.
    checked: list[str] = []
    check = VramGate.check

    def counted(gate: VramGate, candidate: Placement, /) -> GateResult:
        checked.append(candidate.name)
        return check(gate, candidate)

    monkeypatch.setattr(VramGate, "check", counted)
    result = run(**_crew_on_two_providers(6))
    assert [a.phases["mulling"].provider for a in result.agents] == ["gpu-a"] * 4 + ["gpu-b"] * 2
    assert checked == []
    record = result.agents[5].phases["mulling"].decision
    assert sorted(checked) == ["m-a", "m-b"]
    vram = record.candidates["m-a"].gate("VRAM")
    assert vram is not None and vram.reason == "5000 + 1024 reserve ≤ 49152 MiB"
    result.agents[4].phases["mulling"].decision  # noqa: B018 - a second record reads them again
    assert sorted(checked) == ["m-a", "m-b"]  # made once per pass
