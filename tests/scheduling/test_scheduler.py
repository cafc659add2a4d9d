"""The spec's statements about operator-side scheduling, as tests."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from kubemoot.api import KubemootConfig, ModelStatus
from kubemoot.gates import Outcome
from kubemoot.testing.builders import agent, archetype, model, policy, provider, rule

from .conftest import NOW, run

TOOLS = {"capability/tool-calling": "true"}


def tiers(provider_ref: str = "gpu", suffix: str = "") -> list:  # type: ignore[type-arg]
    return [
        model(
            f"qwen3-32b{suffix}",
            model_id="qwen3:32b",
            provider=provider_ref,
            vram_mib=20480,
            labels={**TOOLS, "latencyClass": "high", "params": "32B"},
        ),
        model(
            f"qwen3-14b{suffix}",
            model_id="qwen3:14b",
            provider=provider_ref,
            vram_mib=9216,
            labels={**TOOLS, "latencyClass": "medium", "params": "14B"},
        ),
        model(
            f"qwen3-8b{suffix}",
            model_id="qwen3:8b",
            provider=provider_ref,
            vram_mib=5632,
            labels={**TOOLS, "latencyClass": "low", "params": "8B"},
        ),
    ]


BIAS = {"reasoning": "0.7", "tool-calling": "0.3"}


def bias_policy(**kw: object) -> object:
    return policy(
        "crew",
        crew_ref="crew",
        quality_bias=BIAS,
        rules=[rule("mulling", require=TOOLS), rule("triage", require=TOOLS)],
        **kw,  # type: ignore[arg-type]
    )


def test_bias_07_ranks_high_medium_low_and_03_flips_it() -> None:
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768, max_parallel=4)],
        agents=[
            agent("synth", capabilities=["reasoning", "tool-calling"], crew="crew"),
            agent("tooler", capabilities=["tool-calling"], crew="crew"),
        ],
        policies=[bias_policy()],
    )
    synth, tooler = result.agent("crew-a", "synth"), result.agent("crew-a", "tooler")
    assert synth is not None and tooler is not None
    assert synth.phases["mulling"].model == "qwen3-32b"
    assert list(synth.phases["mulling"].candidates) == [
        ("qwen3:32b", 70.0),
        ("qwen3:14b", 50.0),
        ("qwen3:8b", 30.0),
    ]
    assert tooler.phases["mulling"].model == "qwen3-8b"
    assert list(tooler.phases["mulling"].candidates) == [
        ("qwen3:8b", 70.0),
        ("qwen3:14b", 50.0),
        ("qwen3:32b", 30.0),
    ]
    assert json.loads(synth.env["KUBEMOOT_MODEL_CANDIDATES_MULLING"]) == [
        {"model": "qwen3:32b", "score": 70},
        {"model": "qwen3:14b", "score": 50},
        {"model": "qwen3:8b", "score": 30},
    ]


def test_explicit_prefer_overrides_the_bias() -> None:
    the_policy = policy(
        "crew",
        crew_ref="crew",
        quality_bias=BIAS,
        rules=[rule("mulling", require=TOOLS, prefer=[(100, {"params": "14B"})])],
    )
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768, max_parallel=4)],
        agents=[agent("synth", capabilities=["reasoning"], crew="crew")],
        policies=[the_policy],
    )
    synth = result.agent("crew-a", "synth")
    assert synth is not None
    assert synth.phases["mulling"].model == "qwen3-14b"
    assert synth.phases["mulling"].candidates[0] == ("qwen3:14b", 100.0)


def test_two_rigs_with_identical_models_split_mulling_and_triage() -> None:
    result = run(
        models=tiers("rig-5090", "-a") + tiers("rig-4090", "-b"),
        providers=[
            provider("rig-5090", vram_total_mib=32768, weight=100),
            provider("rig-4090", vram_total_mib=32768, weight=25),
        ],
        agents=[agent("synth", capabilities=["reasoning"], crew="crew")],
        policies=[bias_policy()],  # no topology spread: the weights alone split the phases
    )
    synth = result.agent("crew-a", "synth")
    assert synth is not None
    assert synth.phases["mulling"].provider == "rig-5090"
    assert synth.phases["triage"].provider == "rig-4090"
    assert synth.env["KUBEMOOT_MODEL_ENDPOINT"] == "http://rig-5090:11434"
    assert synth.env["KUBEMOOT_TRIAGE_MODEL_ENDPOINT"] == "http://rig-4090:11434"
    assert synth.env["KUBEMOOT_TRIAGE_MODEL_MODEL_ID"] == "qwen3:32b"


@pytest.mark.parametrize(
    ("sizes", "want"),
    [
        ({"m-b": 9000, "m-a": 5000}, "m-a"),
        ({"m-a": 9000, "m-b": 5000}, "m-b"),
        ({"m-b": 5000, "m-a": 5000}, "m-a"),  # equal sizes: the name decides
    ],
)
def test_equal_scores_prefer_smaller_declared_vram(sizes: dict[str, int], want: str) -> None:
    models = [
        model(name, model_id=f"x:{name}", provider="gpu", vram_mib=size, labels=TOOLS)
        for name, size in sizes.items()
    ]
    result = run(
        models=models, providers=[provider("gpu", vram_total_mib=32768)], agents=[agent("a")]
    )
    placed = result.agents[0].phases["mulling"]
    assert placed.model == want
    record = placed.decision
    assert len(set(record.scores.values())) == 1  # the tie is real


def test_equal_scores_undeclared_vram_comes_last() -> None:
    # m-a declares no vramMib; its footprint is known from its own status, so it is
    # feasible with the same score, and loses the tie to the declared m-b.
    m_a = model("m-a", provider="gpu", labels=TOOLS).model_copy(
        update={"status": ModelStatus(footprint_mib=4000)}
    )
    m_b = model("m-b", provider="gpu", vram_mib=9000, labels=TOOLS)
    result = run(
        models=[m_a, m_b], providers=[provider("gpu", vram_total_mib=32768)], agents=[agent("a")]
    )
    assert result.agents[0].phases["mulling"].model == "m-b"


def test_unknown_vram_defers_and_never_makes_a_phase_unschedulable() -> None:
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=None)],
        agents=[agent("synth", capabilities=["reasoning"], crew="crew")],
        policies=[bias_policy()],
    )
    for phase in result.agents[0].phases.values():
        assert phase.outcome is Outcome.DEFER
        assert "VRAM UNKNOWN" in phase.reason and "vramTotalMiB" in phase.reason
        assert "no match" not in phase.reason.lower()
    assert not result.events
    condition = result.agents[0].conditions[0]
    assert (condition.status, condition.reason) == ("False", "SchedulingDeferred")


def test_stale_status_defers_naming_the_stale_evidence() -> None:
    old = provider("gpu", vram_total_mib=32768, last_probed_at=NOW - timedelta(minutes=10))
    result = run(models=tiers(), providers=[old], agents=[agent("a")])
    phase = result.agents[0].phases["mulling"]
    assert phase.outcome is Outcome.DEFER
    assert "Freshness STALE" in phase.reason


def test_candidate_list_keeps_models_whose_provider_is_not_ready() -> None:
    result = run(
        models=tiers("up") + tiers("down", "-d"),
        providers=[
            provider("up", vram_total_mib=32768, max_parallel=4),
            provider("down", vram_total_mib=32768, ready=False),
        ],
        agents=[agent("synth", capabilities=["reasoning"], crew="crew")],
        policies=[bias_policy()],
    )
    synth = result.agents[0]
    assert synth.phases["mulling"].provider == "up"
    ids = [m for m, _ in synth.phases["mulling"].candidates]
    assert ids == ["qwen3:32b", "qwen3:14b", "qwen3:8b"]  # one entry per identifier
    only_down = (
        run(
            models=tiers("down"),
            providers=[provider("down", vram_total_mib=32768, ready=False)],
            agents=[agent("synth", capabilities=["reasoning"], crew="crew")],
            policies=[bias_policy()],
        )
        .agents[0]
        .phases["mulling"]
    )
    assert only_down.outcome is Outcome.UNSCHEDULABLE
    assert [m for m, _ in only_down.candidates] == ["qwen3:32b", "qwen3:14b", "qwen3:8b"]


def test_candidate_list_drops_models_that_are_not_ready() -> None:
    models = [
        *tiers()[:2],
        model(
            "qwen3-8b",
            provider="gpu",
            vram_mib=5632,
            labels={**TOOLS, "latencyClass": "low"},
            ready=False,
        ),
    ]
    result = run(
        models=models, providers=[provider("gpu", vram_total_mib=32768)], agents=[agent("a")]
    )
    assert [m for m, _ in result.agents[0].phases["mulling"].candidates] == [
        "qwen3:14b",
        "qwen3:32b",
    ]


def test_bindings_in_one_pass_count_toward_parallelism() -> None:
    # maxParallel 1 × factor 4: four agents fit on the big card, the fifth spills over.
    result = run(
        models=tiers("big") + tiers("small", "-s"),
        providers=[
            provider("big", vram_total_mib=32768, weight=100),
            provider("small", vram_total_mib=32768, weight=100, vram_used_mib=8192),
        ],
        agents=[agent(f"a{i}") for i in range(5)],
    )
    providers = [a.phases["mulling"].provider for a in result.agents]
    assert providers == ["big"] * 4 + ["small"]
    last = result.agents[-1].phases["mulling"].decision
    assert last.candidates["qwen3-32b"].gate("Parallelism").result.value == "FAIL"  # type: ignore[union-attr]


def test_topology_spread_do_not_schedule_makes_the_later_phase_unschedulable() -> None:
    spread = {
        "whenUnsatisfiable": "DoNotSchedule",
        "topologyKey": "provider",
        "phaseKeys": ["mulling", "triage"],
    }
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768)],
        agents=[agent("a", crew="crew")],
        policies=[policy("crew", crew_ref="crew", spread=spread)],
    )
    phases = result.agents[0].phases
    assert phases["mulling"].outcome is Outcome.PLACE
    assert phases["triage"].outcome is Outcome.UNSCHEDULABLE
    assert "3 didn't satisfy topology spread" in result.events[0].message


def test_topology_spread_schedule_anyway_falls_back() -> None:
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768)],
        agents=[agent("a", crew="crew")],
        policies=[policy("crew", crew_ref="crew", spread=["mulling", "triage"])],
    )
    triage = result.agents[0].phases["triage"]
    assert triage.outcome is Outcome.PLACE and triage.provider == "gpu"
    assert "ScheduleAnyway" in triage.reason


def test_no_policy_means_every_ready_model_with_quality_zero() -> None:
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768)],
        agents=[agent("loner", capabilities=["reasoning"])],
    )
    loner = result.agents[0]
    assert loner.policy is None
    assert {s for _, s in loner.phases["mulling"].candidates} == {0.0}
    assert loner.phases["mulling"].outcome is Outcome.PLACE
    # Equal quality: the smaller declared model wins the tie.
    assert loner.phases["mulling"].model == "qwen3-8b"


@pytest.mark.parametrize(
    ("crew_label", "policies", "want"),
    [
        ("crew-x", ["crew-x", "crew-y"], "p-crew-x"),
        (None, ["crew-x"], "p-crew-x"),
        (None, ["crew-x", "crew-y"], None),
        ("crew-z", ["crew-x"], None),
        (None, [], None),
    ],
)
def test_policy_resolution(crew_label: str | None, policies: list[str], want: str | None) -> None:
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768)],
        agents=[agent("a", crew=crew_label)],
        policies=[policy(f"p-{crew}", crew_ref=crew) for crew in policies],
    )
    chosen = result.agents[0].policy
    assert (None if chosen is None else chosen.metadata.name) == want


def test_policy_in_another_namespace_does_not_apply() -> None:
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768)],
        agents=[agent("a", namespace="crew-b", crew="crew")],
        policies=[policy("crew", crew_ref="crew")],
    )
    assert result.agents[0].policy is None


def test_unknown_phase_is_a_policy_condition_not_a_crash() -> None:
    the_policy = policy(
        "crew", crew_ref="crew", rules=[rule("mulling"), rule("deliberating", require=TOOLS)]
    )
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768)],
        agents=[agent("a", crew="crew")],
        policies=[the_policy],
    )
    valid = result.policies[0].conditions[0]
    assert (valid.type, valid.status, valid.reason) == ("Valid", "False", "UnknownPhase")
    assert '"deliberating"' in (valid.message or "")
    assert set(result.agents[0].phases) == {"mulling", "triage"}


def test_unknown_archetype_is_reported_and_consent3_is_used() -> None:
    the_policy = policy("crew", crew_ref="crew", archetype_ref="holacracy")
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768)],
        agents=[agent("a", crew="crew")],
        policies=[the_policy],
    )
    assert result.policies[0].conditions[0].reason == "ArchetypeNotFound"
    assert set(result.agents[0].phases) == {"mulling", "triage"}


def test_a_bundle_archetype_defines_the_phases() -> None:
    the_policy = policy(
        "crew", crew_ref="crew", archetype_ref="solo", rules=[rule("solo-think", require=TOOLS)]
    )
    result = run(
        models=tiers(),
        providers=[provider("gpu", vram_total_mib=32768)],
        agents=[agent("a", crew="crew")],
        policies=[the_policy],
        archetypes=[archetype("solo", phases=["solo-think"])],
    )
    assert set(result.agents[0].phases) == {"solo-think"}
    assert result.policies[0].conditions[0].status == "True"
    assert "KUBEMOOT_MODEL_MODEL" not in result.agents[0].env


def test_binpack_prefers_the_fuller_provider() -> None:
    providers = [
        provider("empty", vram_total_mib=32768),
        provider("half", vram_total_mib=32768, vram_used_mib=16384),
    ]
    models = tiers("empty") + tiers("half", "-h")
    spread_pick = run(models=models, providers=providers, agents=[agent("a")])
    config = KubemootConfig.model_validate(
        {"metadata": {"name": "c"}, "spec": {"scheduler": {"strategy": "binpack"}}}
    )
    binpack_pick = run(models=models, providers=providers, agents=[agent("a")], config=config)
    assert spread_pick.agents[0].phases["mulling"].provider == "empty"
    assert binpack_pick.agents[0].phases["mulling"].provider == "half"


def test_image_locality_bonus_prefers_the_loaded_copy() -> None:
    providers = [
        provider("a", vram_total_mib=32768),
        provider("b", vram_total_mib=32768, loaded=["qwen3:8b"]),
    ]
    result = run(models=tiers("a") + tiers("b", "-b"), providers=providers, agents=[agent("x")])
    mulling = result.agents[0].phases["mulling"]
    assert mulling.model == "qwen3-8b-b"
    assert mulling.decision.score_breakdown["qwen3-8b-b"]["ImageLocality"] == 100.0
