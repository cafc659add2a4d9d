"""A whole pass over a cluster shaped like ``bench/schedule.py``'s, a few hundred Agents.

``schedule_bundle`` reads each Agent's metadata once, sorts per namespace and shares
decisions between Agents; the answers must be those of scheduling the Agents one by one
in (namespace, name) order, and each must agree with the full decision record.
"""

from __future__ import annotations

import gc
import random
from datetime import timedelta
from typing import Any

import pytest

from kubemoot.api import Agent
from kubemoot.gates import Outcome
from kubemoot.scheduling import ClusterSnapshot, SchedulingPass, schedule_bundle
from kubemoot.scheduling.scheduler import collector_paused
from kubemoot.testing.builders import agent, model, policy, provider, rule, selector

from .conftest import NOW, assert_phases_agree_with_their_records

TOOLS = {"capability/tool-calling": "true"}
CAPABILITIES = ("tool-calling", "reasoning", "coding", "kubernetes")


def _cluster(rng: random.Random) -> dict[str, Any]:
    providers = [
        provider(
            f"gpu-{index:02d}",
            vram_total_mib=None if index % 7 == 3 else rng.choice((24576, 49152)),
            max_parallel=rng.choice((1, 2, 3)),
            agent_count=rng.randrange(0, 2),
            last_probed_at=NOW - timedelta(seconds=rng.choice((5, 30, 600))),
        )
        for index in range(14)
    ]
    models = []
    for index in range(40):
        labels = {
            "family": rng.choice(("qwen3", "llama3", "gemma3")),
            "latencyClass": rng.choice(("low", "medium", "high")),
            **(TOOLS if rng.random() < 0.8 else {}),
        }
        models.append(
            model(f"m-{index:02d}", model_id=f"m:{index % 9}", provider=f"gpu-{index % 15:02d}",
                  vram_mib=rng.choice((3500, 9216, 20480)), labels=labels)
        )
    policies = []
    for index in range(5):
        mulling = rule("mulling", require=TOOLS)
        triage = rule("triage", require=selector(TOOLS), prefer=[(100, {"latencyClass": "low"})])
        policies.append(
            policy(
                f"policy-{index}",
                f"crew-{index}",
                crew_ref=f"crew-{index}",
                rules=[mulling, triage],
                quality_bias={"reasoning": "0.8", "default": "0.4"} if index % 2 else None,
                spread=["mulling", "triage"] if index != 4 else None,
            )
        )
    agents = []
    for index in rng.sample(range(400), 400):  # names arrive in no order
        namespace = f"crew-{index % 6}"  # crew-5 has no policy
        crew = rng.choice((f"crew-{index % 6}", f"crew-{index % 6}", None, "nobody"))
        agents.append(
            agent(f"agent-{index:03d}", namespace, crew=crew,
                  capabilities=rng.sample(CAPABILITIES, rng.randint(0, 2)))
        )
    return {"models": models, "providers": providers, "policies": policies, "agents": agents}


def one_by_one(snapshot: ClusterSnapshot, *, decisions: bool = True) -> dict[str, Any]:
    """The result of scheduling the snapshot's Agents one at a time, in name order."""
    scheduling = SchedulingPass(snapshot, now=NOW)
    for each in sorted(snapshot.agents, key=lambda a: (a.namespace or "default", a.metadata.name)):
        scheduling.schedule(each)
    return scheduling.result().to_dict(decisions=decisions)


def test_a_pass_agrees_with_scheduling_agent_by_agent_and_with_the_engine() -> None:
    snapshot = ClusterSnapshot.build(**_cluster(random.Random(11)))
    result = schedule_bundle(snapshot, now=NOW)
    keys = [(a.namespace, a.name) for a in result.agents]
    assert keys == sorted(keys) and len(keys) == 400
    assert result.to_dict() == one_by_one(snapshot)
    outcomes = {p.outcome for a in result.agents for p in a.phases.values()}
    assert {Outcome.PLACE, Outcome.DEFER} <= outcomes  # providers fill up, some are unknown
    assert_phases_agree_with_their_records(result)


def test_a_second_pass_over_the_same_snapshot_gives_the_same_answers() -> None:
    snapshot = ClusterSnapshot.build(**_cluster(random.Random(5)))
    first = schedule_bundle(snapshot, now=NOW).to_dict(decisions=False)
    assert schedule_bundle(snapshot, now=NOW).to_dict(decisions=False) == first


def _twin(capabilities: list[str]) -> Agent:
    return agent("same", "crew-a", crew="crew-a", capabilities=capabilities)


def test_agents_that_share_a_namespace_and_name_are_both_scheduled_in_the_order_given() -> None:
    first, second = _twin(["reasoning"]), _twin(["coding"])
    snapshot = ClusterSnapshot.build(
        models=[model("m", provider="gpu", labels=TOOLS)],
        providers=[provider("gpu", vram_total_mib=32768, max_parallel=4)],
        agents=[agent("b", "crew-a"), first, second, agent("a", "crew-a")],
        policies=[policy("p", "crew-a", crew_ref="crew-a", rules=[rule("mulling")])],
    )
    result = schedule_bundle(snapshot, now=NOW)
    assert [a.name for a in result.agents] == ["a", "b", "same", "same"]
    assert result.agents[2].agent is first and result.agents[3].agent is second


def test_the_collector_is_paused_for_a_pass_only() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a pass that fails still turns the collector back on")
    assert gc.isenabled()
    gc.disable()  # whoever turned it off keeps it off
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
