"""The roster a pass reads its Agents from, and the run-by-run pass over it.

A whole pass files the Agents by namespace and class (crew label, capabilities) and
binds each namespace in runs of Agents that reuse their groups' decisions. Its answers
must be those of scheduling the Agents one by one in (namespace, name) order, whatever
the cluster: providers that several groups fill together, providers without an agent
limit, UNSCHEDULABLE phases (events name each Agent), several crews in a namespace.
A roster kept between passes and told of edits, moves and deletions must give what a
roster filed afresh gives.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest

from kubemoot.api import Agent
from kubemoot.gates import Outcome
from kubemoot.scheduling import ClusterSnapshot, schedule_bundle
from kubemoot.scheduling.roster import AgentRoster
from kubemoot.testing.builders import agent, model, policy, provider, rule

from .conftest import NOW, assert_phases_agree_with_their_records
from .test_pass_at_scale import one_by_one

TOOLS = {"tools": "true"}
CAPABILITIES = ("tool-calling", "reasoning", "coding")


#: One crew label per namespace: a pass groups such a namespace by capabilities alone
#: (ns-a, ns-b: under a qualityBias) or binds it whole without sorting it (ns-c).
ONE_CREW = {"ns-a": "alpha", "ns-b": "gamma", "ns-c": None}


def _cluster(rng: random.Random, *, one_crew: bool = False) -> dict[str, Any]:
    providers = [
        provider(
            f"gpu-{index}",
            vram_total_mib=rng.choice((None, 24576, 49152)),
            # None: no agent limit, so that provider never fills.
            max_parallel=rng.choice((None, 1, 2, 4)),
            agent_count=rng.randrange(0, 2),
            last_probed_at=NOW - timedelta(seconds=rng.choice((5, 30, 600))),
        )
        for index in range(8)
    ]
    models = [
        model(
            f"m-{index:02d}",
            model_id=f"m:{index % 5}",
            provider=f"gpu-{index % 8}",
            vram_mib=rng.choice((3500, 9216)),
            labels={
                "latencyClass": rng.choice(("low", "high")),
                **(TOOLS if rng.random() < 0.7 else {}),
            },
        )
        for index in range(20)
    ]
    policies = [
        policy("p-a", "ns-a", crew_ref="alpha", rules=[rule("mulling", require=TOOLS)],
               quality_bias={"reasoning": "0.9", "coding": "0.2", "default": "0.5"},
               spread=["mulling", "triage"]),
        policy("p-b", "ns-a", crew_ref="beta", rules=[rule("triage", require=TOOLS)]),
        # Nothing carries this label: triage is UNSCHEDULABLE, one event per Agent.
        policy("p-c", "ns-b", crew_ref="gamma", rules=[rule("triage", require={"no": "x"})],
               quality_bias={"reasoning": "0.1", "default": "0.7"}),
    ]
    agents = []
    for index in rng.sample(range(120), 120):
        namespace = rng.choice(("ns-a", "ns-a", "ns-b", "ns-c"))
        crew = ONE_CREW[namespace] if one_crew else rng.choice(("alpha", "beta", "gamma", None))
        agents.append(
            agent(f"agent-{index:03d}", namespace, crew=crew,
                  capabilities=rng.sample(CAPABILITIES, rng.randint(0, 2)))
        )
    return {"models": models, "providers": providers, "policies": policies, "agents": agents}


@pytest.mark.parametrize("one_crew", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_a_pass_run_by_run_agrees_with_one_agent_at_a_time(seed: int, one_crew: bool) -> None:
    snapshot = ClusterSnapshot.build(**_cluster(random.Random(seed), one_crew=one_crew))
    result = schedule_bundle(snapshot, now=NOW)
    assert result.to_dict(decisions=False) == one_by_one(snapshot, decisions=False)
    outcomes = {p.outcome for a in result.agents for p in a.phases.values()}
    assert Outcome.UNSCHEDULABLE in outcomes and result.events


def test_the_run_by_run_pass_agrees_with_the_decision_records() -> None:
    snapshot = ClusterSnapshot.build(**_cluster(random.Random(3)))
    result = schedule_bundle(snapshot, now=NOW)
    assert_phases_agree_with_their_records(result)


def test_results_read_in_any_order_are_the_same() -> None:
    snapshot = ClusterSnapshot.build(**_cluster(random.Random(4)))
    forward = schedule_bundle(snapshot, now=NOW)
    backward = schedule_bundle(snapshot, now=NOW)
    # The last result read first writes out every run before it.
    last = backward.agents[len(backward.agents) - 1].to_dict()
    assert last == forward.agents[-1].to_dict()
    assert backward.to_dict() == forward.to_dict()


def _edited(original: Agent, *, crew: str | None, capabilities: list[str]) -> Agent:
    return agent(original.metadata.name, original.namespace or "default", crew=crew,
                 capabilities=capabilities)


def test_a_kept_roster_told_of_changes_gives_the_answers_of_a_fresh_one() -> None:
    cluster = _cluster(random.Random(8))
    agents: list[Agent] = cluster.pop("agents")
    roster = AgentRoster(agents)
    first = schedule_bundle(ClusterSnapshot.build(**cluster, roster=roster), now=NOW)
    assert first.to_dict(decisions=False) == schedule_bundle(
        ClusterSnapshot.build(**cluster, agents=agents), now=NOW
    ).to_dict(decisions=False)
    before = {segment.namespace: segment for segment in roster.segments()}

    by_name = {a.metadata.name: a for a in agents}
    in_a = sorted(n for n, a in by_name.items() if a.namespace == "ns-a")
    in_b = sorted(n for n, a in by_name.items() if a.namespace == "ns-b")
    # An edit: other capabilities, so another class (and under p-a another bias) ...
    edited = _edited(by_name[in_a[0]], crew="alpha", capabilities=["reasoning"])
    # ... a move to another crew, so another policy and group ...
    moved = _edited(by_name[in_a[1]], crew="beta", capabilities=[])
    # ... a deletion, and an Agent that is new.
    deleted = by_name[in_a[2]]
    added = agent("agent-new", "ns-a", crew="alpha", capabilities=["coding"])
    for changed in (edited, moved, added):
        roster.put(changed)
    roster.discard("ns-a", deleted.metadata.name)
    roster.discard("ns-a", "no-such-agent")  # nothing to forget: nothing changes
    now_agents = [
        {edited.metadata.name: edited, moved.metadata.name: moved}.get(a.metadata.name, a)
        for a in agents
        if a is not deleted
    ] + [added]
    assert len(roster) == len(now_agents)

    fresh = ClusterSnapshot.build(**cluster, agents=now_agents)
    kept = ClusterSnapshot.build(**cluster, roster=roster)
    assert [a.metadata.name for a in kept.agents] == [
        a.metadata.name
        for a in sorted(now_agents, key=lambda a: (a.namespace or "default", a.metadata.name))
    ]
    second = schedule_bundle(kept, now=NOW)
    assert second.to_dict(decisions=False) == schedule_bundle(fresh, now=NOW).to_dict(
        decisions=False
    )
    assert second.to_dict(decisions=False) == one_by_one(fresh, decisions=False)
    # Only the namespace that changed was filed again.
    after = {segment.namespace: segment for segment in roster.segments()}
    assert after["ns-a"] is not before["ns-a"]
    assert in_b and after["ns-b"] is before["ns-b"]
    assert after["ns-c"] is before["ns-c"]

    # The second time: the namespace emptied of every Agent is gone from the pass.
    for name in in_b:
        roster.discard("ns-b", name)
    third = schedule_bundle(ClusterSnapshot.build(**cluster, roster=roster), now=NOW)
    assert {a.namespace for a in third.agents} == {"ns-a", "ns-c"}
    rest = [a for a in now_agents if a.namespace != "ns-b"]
    assert third.to_dict(decisions=False) == schedule_bundle(
        ClusterSnapshot.build(**cluster, agents=rest), now=NOW
    ).to_dict(decisions=False)


def test_an_agent_put_again_replaces_its_twins_too() -> None:
    twins = [agent("same", "ns-a", crew="alpha"), agent("same", "ns-a", crew="beta")]
    roster = AgentRoster([*twins, agent("other", "ns-a")])
    assert len(roster) == 3
    assert [a.metadata.labels.get("kubemoot.ai/crew") for a in roster.agents()] == [
        None, "alpha", "beta"
    ]
    roster.put(agent("same", "ns-a", crew="gamma"))
    assert len(roster) == 2
    assert [a.metadata.labels.get("kubemoot.ai/crew") for a in roster.agents()] == [
        None, "gamma"
    ]


def test_an_agent_added_to_a_filed_namespace_brings_its_class_to_the_pass() -> None:
    cluster = _cluster(random.Random(9), one_crew=True)
    agents: list[Agent] = cluster.pop("agents")
    roster = AgentRoster(agents)
    schedule_bundle(ClusterSnapshot.build(**cluster, roster=roster), now=NOW)
    # A class ns-a has not held: another crew, so another policy and another group.
    newcomer = agent("agent-000a", "ns-a", crew="beta", capabilities=["coding"])
    roster.put(newcomer)
    kept = schedule_bundle(ClusterSnapshot.build(**cluster, roster=roster), now=NOW)
    fresh = ClusterSnapshot.build(**cluster, agents=[*agents, newcomer])
    assert kept.to_dict(decisions=False) == one_by_one(fresh, decisions=False)
    assert kept.agent("ns-a", "agent-000a").policy_name == "p-b"  # type: ignore[union-attr]


@pytest.mark.parametrize("given", ["name order", "reversed", "shuffled"])
def test_a_namespace_files_alike_whatever_order_its_agents_come_in(given: str) -> None:
    # A namespace given in name order is read as it came; any other order is sorted.
    # Agents that share a name keep the order they came in, either way.
    alpha, beta = agent("b", "ns-a", crew="alpha"), agent("b", "ns-a", crew="beta")
    named = [agent("a", "ns-a", crew="beta", capabilities=["coding"]), alpha, beta,
             agent("c", "ns-a", crew="alpha"), agent("a", "ns-b")]
    agents = {"name order": named, "reversed": named[::-1],
              "shuffled": random.Random(5).sample(named, len(named))}[given]
    segment, other = AgentRoster(agents).segments()
    twins = [a for a in segment.agents if a.metadata.name == "b"]
    assert twins == ([alpha, beta] if agents.index(alpha) < agents.index(beta) else [beta, alpha])
    assert [a.metadata.name for a in segment.agents] == ["a", "b", "b", "c"]
    assert [segment.agent_class(n) for n in segment.class_at] == [
        (a.metadata.labels.get("kubemoot.ai/crew"), tuple(a.spec.capabilities))
        for a in segment.agents
    ]
    # Each class present once, in the order the classes first came.
    first_seen = [segment.class_at[[*segment.agents].index(a)] for a in agents
                  if a.metadata.namespace == "ns-a"]
    assert segment.present == list(dict.fromkeys(first_seen)) and len(other) == 1


def test_a_snapshot_files_capabilities_only_where_a_quality_bias_reads_them() -> None:
    # ns-a: alpha under p-a (a qualityBias), beta under p-b (none); ns-b: gamma under p-c
    # (a qualityBias); ns-c: no policy at all.
    cluster = _cluster(random.Random(6))
    snapshot = ClusterSnapshot.build(**cluster)
    classes = {
        (segment.namespace, *segment.agent_class(number))
        for segment in snapshot.roster.segments()
        for number in segment.present
    }
    # Where capabilities cannot change a binding, a crew label is one class, unread.
    unread = {(ns, crew) for ns, crew, capabilities in classes if capabilities is None}
    read = {(ns, crew) for ns, crew, capabilities in classes if capabilities is not None}
    assert unread and read and not unread & read
    assert all(
        snapshot.capabilities_matter(ns, crew) == ((ns, crew) in read)
        for ns, crew, _ in classes
    )
    assert ("ns-a", "beta") in unread and ("ns-c", None) in unread
    assert ("ns-a", "alpha") in read and ("ns-b", "gamma") in read
    # A roster filed without the snapshot's policies reads every Agent's capabilities,
    # and both bind alike.
    assert all(
        capabilities is not None
        for segment in AgentRoster(cluster["agents"]).segments()
        for _, capabilities in map(segment.agent_class, segment.present)
    )
    kept = ClusterSnapshot.build(**{**cluster, "agents": ()},
                                 roster=AgentRoster(cluster["agents"]))
    assert schedule_bundle(snapshot, now=NOW).to_dict() == schedule_bundle(
        kept, now=NOW
    ).to_dict()
