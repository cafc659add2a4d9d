"""``NotIn`` and ``DoesNotExist`` in a policy exclude models end to end.

A label value or a label a policy rules out must be gone from everything the pass
writes: the bound model, the ranked candidates, the env the Deployment gets, and the
explanation when nothing is left. Kubernetes semantics: a model without the label
matches ``NotIn`` and ``DoesNotExist``.
"""

from __future__ import annotations

import json

from kubemoot.gates import Outcome
from kubemoot.testing.builders import agent, model, policy, provider, rule, selector

from .conftest import run
from .test_scheduler import BIAS, TOOLS, tiers

AGENTS = [
    agent("synth", capabilities=["reasoning", "tool-calling"], crew="crew"),
    agent("tooler", capabilities=["tool-calling"], crew="crew"),
]
GPU = provider("gpu", vram_total_mib=32768, max_parallel=4)


def _excluding(*expressions: tuple[str, str] | tuple[str, str, list[str]]) -> object:
    return policy("crew", crew_ref="crew", quality_bias=BIAS,
                  rules=[rule("mulling", require=selector(TOOLS, *expressions))])


def _mulling(models: list, the_policy: object) -> dict[str, tuple]:  # type: ignore[type-arg]
    """Per agent: bound model id, candidate ids, candidate ids in its env."""
    result = run(models=models, providers=[GPU], agents=AGENTS,
                 policies=[the_policy])  # type: ignore[list-item]
    seen = {}
    for bound in result.agents:
        phase = bound.phases["mulling"]
        env = json.loads(bound.env.get("KUBEMOOT_MODEL_CANDIDATES_MULLING", "[]"))
        seen[bound.agent.metadata.name] = (
            phase.outcome,
            phase.placement.model_id if phase.placement is not None else None,
            [m for m, _score in phase.candidates],
            [c["model"] for c in env],
        )
    return seen


def test_not_in_excludes_the_value_from_binding_candidates_and_env() -> None:
    # Without the rule the synthesizer binds qwen3:32b (test_scheduler); ruled out,
    # it is nowhere: not bound, not ranked, not in the env the agent reads.
    seen = _mulling(tiers(), _excluding(("params", "NotIn", ["32B"])))
    assert seen["synth"] == (Outcome.PLACE, "qwen3:14b", ["qwen3:14b", "qwen3:8b"],
                             ["qwen3:14b", "qwen3:8b"])
    assert seen["tooler"] == (Outcome.PLACE, "qwen3:8b", ["qwen3:8b", "qwen3:14b"],
                              ["qwen3:8b", "qwen3:14b"])


def test_not_in_keeps_a_model_without_the_label() -> None:
    models = tiers()
    unlabelled = model("qwen3-4b", model_id="qwen3:4b", provider="gpu", vram_mib=3000,
                       labels={**TOOLS, "latencyClass": "low"})  # no params label at all
    seen = _mulling([*models, unlabelled], _excluding(("params", "NotIn", ["32B", "14B"])))
    for name in ("synth", "tooler"):
        outcome, _bound, candidates, env = seen[name]
        assert outcome is Outcome.PLACE
        assert sorted(candidates) == sorted(env) == ["qwen3:4b", "qwen3:8b"]


def test_does_not_exist_excludes_every_model_carrying_the_label() -> None:
    models = tiers()
    marked = {"qwen3:32b", "qwen3:8b"}
    for m in models:
        if m.spec.model in marked:
            m.metadata.labels["deprecated"] = "true"
    seen = _mulling(models, _excluding(("deprecated", "DoesNotExist")))
    for name in ("synth", "tooler"):
        assert seen[name] == (Outcome.PLACE, "qwen3:14b", ["qwen3:14b"], ["qwen3:14b"])


def test_excluding_everything_is_unschedulable_and_says_which_selector() -> None:
    the_policy = _excluding(("params", "NotIn", ["32B", "14B", "8B"]))
    result = run(models=tiers(), providers=[GPU], agents=AGENTS[:1],
                 policies=[the_policy])  # type: ignore[list-item]
    [bound] = result.agents
    phase = bound.phases["mulling"]
    assert phase.outcome is Outcome.UNSCHEDULABLE and phase.placement is None
    assert list(phase.candidates) == []
    assert "KUBEMOOT_MODEL_CANDIDATES_MULLING" not in bound.env
    assert bound.last_unschedulable is not None
    assert "params not in 32B|14B|8B" in bound.last_unschedulable.reason
    # the other phase has no rule and still binds
    assert bound.phases["triage"].outcome is Outcome.PLACE
