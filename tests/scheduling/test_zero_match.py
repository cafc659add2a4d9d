"""The zero-match surface: FailedScheduling events, conditions, lastUnschedulable."""

from __future__ import annotations

from kubemoot.gates import Outcome
from kubemoot.testing.builders import agent, model, policy, provider, rule, selector

from .conftest import NOW, run

REQUIRE = selector({"capability/tool-calling": "true"}, ("params", "In", ["14B", "32B"]))


def three_cpu_models() -> list:  # type: ignore[type-arg]
    return [
        model(f"phi3-{size}", provider="cpu", vram_mib=0, labels={"family": "phi3"})
        for size in ("mini", "small", "medium")
    ]


def test_failed_scheduling_message_has_kube_scheduler_shape() -> None:
    the_policy = policy(
        "homelab-pilot-default", crew_ref="pilot", rules=[rule("mulling", require=REQUIRE)]
    )
    result = run(
        models=three_cpu_models(),
        providers=[provider("cpu", vram_total_mib=16384)],
        agents=[agent("kubectl-agent", crew="pilot")],
        policies=[the_policy],
    )
    mulling = result.agents[0].phases["mulling"]
    assert mulling.outcome is Outcome.UNSCHEDULABLE
    [event] = result.events
    assert event.to_dict() == {
        "type": "Warning",
        "reason": "FailedScheduling",
        "regarding": "CrewSchedulingPolicy/crew-a/homelab-pilot-default",
        "message": "0/3 models are available for phase mulling: 3 didn't match require selector.",
        "count": 1,
        "agents": ["crew-a/kubectl-agent"],
    }
    last = result.agents[0].last_unschedulable
    assert last is not None
    assert last.phase == "mulling"
    assert last.observed_at == NOW
    assert last.crew_scheduling_policy == "homelab-pilot-default"
    assert last.reason == (
        "no Model matches require selectors {capability/tool-calling: true, params: 14B|32B}"
    )
    agent_condition = result.agents[0].conditions[0]
    assert (agent_condition.type, agent_condition.status, agent_condition.reason) == (
        "Scheduled",
        "False",
        "Unschedulable",
    )
    scheduled = result.policies[0].conditions[1]
    assert (scheduled.type, scheduled.status, scheduled.reason) == (
        "Scheduled",
        "False",
        "AgentsUnschedulable",
    )
    assert "crew-a/kubectl-agent phase mulling" in (scheduled.message or "")
    # triage has no rule, so it still binds: one phase failing does not lose the other.
    assert result.agents[0].phases["triage"].outcome is Outcome.PLACE


def test_message_counts_each_reason_in_gate_order() -> None:
    models = [
        model("a-8b", provider="gpu", vram_mib=5000, labels={"x": "1"}),
        model("b-8b", provider="gpu", vram_mib=5000, labels={"x": "1"}),
        model("c-8b", provider="down", vram_mib=5000, labels={"x": "2"}),
        model("d-70b", provider="gpu", vram_mib=40000, labels={"x": "2"}),
        model("e-8b", provider="nowhere", vram_mib=5000, labels={"x": "2"}),
    ]
    the_policy = policy("p", rules=[rule("mulling", require={"x": "2"})])
    result = run(
        models=models,
        providers=[
            provider("gpu", vram_total_mib=32768),
            provider("down", ready=False, vram_total_mib=32768),
        ],
        agents=[agent("a")],
        policies=[the_policy],
    )
    assert result.events[0].message == (
        "0/5 models are available for phase mulling: 2 didn't match require selector, "
        "1 provider not ready, 1 providerRef not found, 1 insufficient VRAM."
    )


def test_repeated_failures_are_counted_on_one_event() -> None:
    the_policy = policy("p", rules=[rule("mulling", require=REQUIRE)])
    result = run(
        models=three_cpu_models(),
        providers=[provider("cpu", vram_total_mib=16384)],
        agents=[agent("a"), agent("b")],
        policies=[the_policy],
    )
    [event] = result.events
    assert event.count == 2 and event.agents == ["crew-a/a", "crew-a/b"]


def test_defer_is_not_failed_scheduling() -> None:
    result = run(
        models=three_cpu_models(), providers=[provider("cpu", ready=None)], agents=[agent("a")]
    )
    mulling = result.agents[0].phases["mulling"]
    assert mulling.outcome is Outcome.DEFER
    assert "ProviderReady UNKNOWN" in mulling.reason
    assert not result.events
    assert result.agents[0].last_unschedulable is None


def test_no_models_at_all_is_unschedulable() -> None:
    result = run(agents=[agent("a")])
    mulling = result.agents[0].phases["mulling"]
    assert mulling.outcome is Outcome.UNSCHEDULABLE
    assert result.events[0].message == "0/0 models are available for phase mulling."
    assert result.events[0].regarding == "Agent/crew-a/a"  # no policy to carry the event


def test_unbound_phase_templates_neither_its_model_nor_its_candidates() -> None:
    """A phase without a binding leaves its env alone; the other phase is written whole."""
    models = [
        model("phi3-mini", provider="cpu", vram_mib=0, labels={"family": "phi3"}),
        model("qwen3-8b", provider="cpu", vram_mib=0, labels={"family": "qwen3"}),
    ]
    the_policy = policy(
        "mixed", crew_ref="pilot",
        rules=[rule("mulling", require={"family": "llama"}),
               rule("triage", require={"family": "qwen3"})],
    )
    result = run(
        models=models,
        providers=[provider("cpu", vram_total_mib=16384)],
        agents=[agent("kubectl-agent", crew="pilot")],
        policies=[the_policy],
    )
    env = result.agents[0].env
    assert result.agents[0].phases["mulling"].outcome is Outcome.UNSCHEDULABLE
    assert "KUBEMOOT_MODEL_MODEL" not in env
    assert "KUBEMOOT_MODEL_CANDIDATES_MULLING" not in env
    assert env["KUBEMOOT_TRIAGE_MODEL_MODEL_ID"] == "qwen3:8b"
    assert '"qwen3:8b"' in env["KUBEMOOT_MODEL_CANDIDATES_TRIAGE"]


def _resolved(result: object, name: str) -> tuple[str, str]:
    agent = next(a for a in result.agents if a.name == name)  # type: ignore[attr-defined]
    found = next(c for c in agent.conditions if c.type == "PolicyResolved")
    return found.status, found.reason


def test_policy_resolved_reasons_say_what_happened() -> None:
    cpu = [provider("cpu", vram_total_mib=16384)]
    models = three_cpu_models()
    one = run(models=models, providers=cpu, agents=[agent("a", crew="pilot")],
              policies=[policy("p", crew_ref="pilot")])
    assert _resolved(one, "a") == ("True", "PolicyMatched")
    twins = run(models=models, providers=cpu, agents=[agent("a", crew="pilot")],
                policies=[policy("p1", crew_ref="pilot"), policy("p2", crew_ref="pilot")])
    assert _resolved(twins, "a") == ("False", "AmbiguousCrewRef")
    stray = run(models=models, providers=cpu, agents=[agent("a", crew="other")],
                policies=[policy("p", crew_ref="pilot")])
    assert _resolved(stray, "a") == ("False", "NoMatchingPolicy")
    unlabelled = run(models=models, providers=cpu, agents=[agent("a")],
                     policies=[policy("p1", crew_ref="x"), policy("p2", crew_ref="y")])
    assert _resolved(unlabelled, "a") == ("False", "AmbiguousPolicy")
    alone = run(models=models, providers=cpu, agents=[agent("a")])
    assert _resolved(alone, "a") == ("False", "NoPolicy")
    bound = next(c for c in alone.agents[0].conditions if c.type == "Scheduled")
    assert (bound.status, bound.reason) == ("True", "Bound")
