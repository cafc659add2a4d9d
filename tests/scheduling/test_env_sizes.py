"""The declared sizes a binding templates into the Deployment (``KUBEMOOT_MODEL_SIZES_MIB``).

An agent process has no Model resources: the env is where it learns each listed model's
declared ``vramMib`` for a cold load nobody has observed yet.
"""

from __future__ import annotations

import json

from kubemoot.scheduling.bind import ENV_MODEL_SIZES, declared_sizes, sizes_json
from kubemoot.scheduling.candidate import Placement
from kubemoot.testing.builders import agent, model, policy, provider, rule

from .conftest import run

TOOLS = {"capability/tool-calling": "true"}
FAST = {**TOOLS, "latencyClass": "low"}


def _policy() -> object:
    return policy("crew", crew_ref="crew",
                  rules=[rule("mulling", require=TOOLS), rule("triage", require=FAST)])


def test_every_listed_identifier_carries_its_declared_size_and_undeclared_ones_none() -> None:
    result = run(
        models=[
            model("qwen3-14b", provider="gpu", vram_mib=9216, labels=TOOLS),
            model("qwen3-8b", provider="gpu", vram_mib=5632, labels=FAST),
            model("phi3-mini", provider="gpu", labels=FAST),  # declares no size
            model("untooled-7b", provider="gpu", vram_mib=4096),  # on no list
        ],
        providers=[provider("gpu", vram_total_mib=32768, max_parallel=4,
                            loaded=[("phi3:mini", 2048)])],
        agents=[agent("a", crew="crew")],
        policies=[_policy()],
    )
    env = result.agents[0].env
    listed = {c["model"] for phase in ("MULLING", "TRIAGE")
              for c in json.loads(env[f"KUBEMOOT_MODEL_CANDIDATES_{phase}"])}
    assert listed == {"qwen3:14b", "qwen3:8b", "phi3:mini"}
    # phi3:mini is listed (sized by what the provider observed) but declares nothing.
    assert json.loads(env[ENV_MODEL_SIZES]) == {"qwen3:14b": 9216, "qwen3:8b": 5632}


def test_a_binding_whose_models_declare_nothing_still_writes_the_variable() -> None:
    # A patch only sets variables: "{}" must overwrite sizes a Model stopped declaring.
    result = run(
        models=[model("phi3-mini", provider="gpu", labels=FAST)],
        providers=[provider("gpu", vram_total_mib=32768, max_parallel=4,
                            loaded=[("phi3:mini", 2048)])],
        agents=[agent("a", crew="crew")],
        policies=[_policy()],
    )
    env = result.agents[0].env
    assert env["KUBEMOOT_MODEL_MODEL"] == "phi3:mini"
    assert env[ENV_MODEL_SIZES] == "{}"


def test_an_unbound_agent_gets_no_sizes_either() -> None:
    result = run(models=[], providers=[provider("gpu", vram_total_mib=32768)],
                 agents=[agent("a", crew="crew")], policies=[_policy()])
    # Nothing can serve either phase: no binding, no sizes, only each phase's reason
    # (the agent stands aside with it and makes no call).
    assert result.agents[0].env == {
        "KUBEMOOT_MODEL_UNSCHEDULABLE_REASON": "0/0 models are available for phase mulling.",
        "KUBEMOOT_TRIAGE_MODEL_UNSCHEDULABLE_REASON":
            "0/0 models are available for phase triage.",
    }


def test_one_identifier_on_two_providers_takes_the_larger_declaration() -> None:
    small = model("qwen3-8b-a", model_id="qwen3:8b", provider="a", vram_mib=5120)
    large = model("qwen3-8b-b", model_id="qwen3:8b", provider="b", vram_mib=6144)
    bare = model("phi3-mini", provider="a")
    placements = [Placement(m, None) for m in (small, large, bare)]
    assert declared_sizes(placements) == {"qwen3:8b": 6144}
    assert declared_sizes(reversed(placements)) == {"qwen3:8b": 6144}


def test_sizes_render_as_compact_json_sorted_by_identifier() -> None:
    assert sizes_json({"qwen3:8b": 5120, "phi3:mini": 2048}) == \
        '{"phi3:mini":2048,"qwen3:8b":5120}'
    assert sizes_json({}) == "{}"
