"""Benchmark of the operator-side scheduler: one pass over a large generated cluster.

5,000 Agents × 500 Models × 100 ModelProviders × 50 CrewSchedulingPolicies (one per
namespace, two phase rules each). Prints the agents bound per second (both phases) and
the ratio of the pass's time to a floor measured in the same run: evaluating every
policy's require selectors once against every Model, the work no scheduler can skip.
Each figure is the best of ``--repeat`` runs (floor and pass alternate). The pass
builds each Agent's result objects on first read; a separate line reports the time to
read them all. The last line is one JSON object:
``{"agentsPerSecond": …, "ratioToFloor": …, "bindingsDigest": …, "ratioToFloorAt10x": …,
"agentsPerSecondAt10x": …, "ratioToAgentFloorAt10x": …, "ratioToFloorAt10xFiled": …,
"sameBindingsFiled": …, "bindingsDigestAt10x": …}``
(the keys with ``At10x`` and ``Filed`` from a second cluster with ten times the agents and
providers, same models and policies, so the same floor). ``bindingsDigest`` is a hash of
every Agent's bindings (each phase's outcome, Model and provider, in pass order): a change
made for speed alone leaves it as it was.

That floor does not grow with the Agents, so at ten times the Agents it leaves out work
no scheduler can skip either: reading each Agent's policy reference (its namespace and
crew label) and emitting one result for it. ``ratioToAgentFloorAt10x`` divides the pass
by the floor plus that per-Agent part (a loop that reads the two fields of every Agent
and appends one tuple per Agent to a list), measured in the same runs.

A pass starts by filing the Agents by namespace, name and what decides their binding
(:mod:`kubemoot.scheduling.roster`). ``ratioToFloorAt10x`` times a pass over the bundle,
filing included, as ``kubemoot schedule`` runs it. ``ratioToFloorAt10xFiled`` times the
same pass over a snapshot given a roster filed before the runs, as a caller that keeps
its roster between passes (and files only the Agents that change) runs it; the time to
file the Agents is printed beside it, and ``sameBindingsFiled`` says whether both passes
bound every Agent alike.

    python bench/schedule.py [--agents 5000] [--models 500] [--providers 100] [--policies 50]
                             [--scale 10] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubemoot.api import CREW_LABEL, Agent, CrewSchedulingPolicy, Model, ModelProvider
from kubemoot.api.loader import Bundle
from kubemoot.scheduling import AgentRoster, ClusterSnapshot, ScheduleResult, schedule_bundle

NOW = datetime(2026, 5, 15, 12, 0, tzinfo=UTC)
FAMILIES = ("qwen3", "llama3", "mistral", "gemma3", "phi4")
SIZES = (
    ("4B", 3500, "low"),
    ("8B", 5632, "low"),
    ("14B", 9216, "medium"),
    ("32B", 20480, "high"),
    ("70B", 43008, "high"),
)
CAPABILITIES = ("tool-calling", "reasoning", "observability", "kubernetes", "coding")


def generate(
    rng: random.Random, *, agents: int, models: int, providers: int, policies: int
) -> Bundle:
    """A reproducible cluster of the requested size."""
    bundle = Bundle()
    for index in range(providers):
        total = rng.choice((24576, 32768, 49152, 81920))
        bundle.add(
            ModelProvider.model_validate(
                {
                    "metadata": {"name": f"gpu-{index:03d}", "labels": {"zone": f"z{index % 5}"}},
                    "spec": {
                        "endpoint": f"http://gpu-{index:03d}:11434",
                        "scheduling": {"weight": rng.choice((25, 50, 100))},
                    },
                    "status": {
                        "ready": rng.random() > 0.05,
                        "lastProbedAt": (
                            NOW - timedelta(seconds=rng.choice((5, 30, 60, 90, 600)))
                        ).isoformat(),
                        "capacity": {
                            "vramTotalMiB": total,
                            "vramUsedMiB": rng.randrange(0, total, 512),
                            "maxParallel": rng.choice((16, 24, 32)),
                            "agentCount": rng.randrange(0, 16),
                        },
                    },
                }
            )
        )
    for index in range(models):
        family = rng.choice(FAMILIES)
        params, vram, latency = rng.choice(SIZES)
        labels = {
            "family": family,
            "params": params,
            "latencyClass": latency,
            "capability/tool-calling": "true" if rng.random() < 0.8 else "false",
        }
        if params in ("32B", "70B"):
            labels["capability/reasoning"] = "true"
        bundle.add(
            Model.model_validate(
                {
                    "metadata": {
                        "name": f"{family}-{params.lower()}-{index:03d}",
                        "labels": labels,
                    },
                    "spec": {
                        "model": f"{family}:{params.lower()}-v{index % 7}",
                        "providerRef": f"gpu-{index % providers:03d}",
                        "vramMib": vram,
                    },
                }
            )
        )
    for index in range(policies):
        sizes = rng.sample([s[0] for s in SIZES], 3)
        mulling: dict[str, Any] = {
            "phase": "mulling",
            "require": {
                "matchLabels": {"capability/tool-calling": "true"},
                "matchExpressions": [{"key": "params", "operator": "In", "values": sizes}],
            },
        }
        triage: dict[str, Any] = {
            "phase": "triage",
            "require": {
                "matchLabels": {"capability/tool-calling": "true"},
                "matchExpressions": [
                    {"key": "family", "operator": "NotIn", "values": [rng.choice(FAMILIES)]}
                ],
            },
            "prefer": [{"weight": 100, "selector": {"matchLabels": {"latencyClass": "low"}}}],
        }
        spec: dict[str, Any] = {
            "crewRef": f"crew-{index:02d}",
            "rules": [mulling, triage],
            "topologySpread": {"topologyKey": "provider", "phaseKeys": ["mulling", "triage"]},
        }
        if index % 2:
            mulling["prefer"] = [{"weight": 80, "selector": {"matchLabels": {"family": "qwen3"}}}]
        else:
            spec["qualityBias"] = {"reasoning": "0.8", "tool-calling": "0.3", "default": "0.5"}
        bundle.add(
            CrewSchedulingPolicy.model_validate(
                {
                    "metadata": {"name": f"policy-{index:02d}", "namespace": f"crew-{index:02d}"},
                    "spec": spec,
                }
            )
        )
    for index in range(agents):
        crew = index % policies
        bundle.add(
            Agent.model_validate(
                {
                    "metadata": {
                        "name": f"agent-{index:05d}",
                        "namespace": f"crew-{crew:02d}",
                        "labels": {"kubemoot.ai/crew": f"crew-{crew:02d}"},
                    },
                    "spec": {"capabilities": rng.sample(CAPABILITIES, rng.randint(1, 3))},
                }
            )
        )
    return bundle


#: What the figures are timed with: wall time by default; ``--clock cpu`` times this
#: process's CPU instead, which on a shared machine leaves out the time other processes
#: hold the core (the floor and the pass are both pure computation in one thread).
clock = time.perf_counter


def floor_seconds(bundle: Bundle) -> float:
    """Every policy's require selectors against every Model, once."""
    start = clock()
    admitted = 0
    for policy in bundle.policies:
        for rule in policy.spec.rules:
            for model in bundle.models:
                admitted += rule.admits(model.metadata.labels)
    elapsed = clock() - start
    assert admitted > 0
    return elapsed


def agent_floor_seconds(bundle: Bundle) -> float:
    """Each Agent's namespace and crew label read, and one result emitted per Agent."""
    start = clock()
    emitted: list[tuple[str | None, str | None]] = []
    for agent in bundle.agents:
        metadata = agent.metadata
        emitted.append((metadata.namespace, metadata.labels.get(CREW_LABEL)))
    elapsed = clock() - start
    assert len(emitted) == len(bundle.agents)
    return elapsed


def read_seconds(result: ScheduleResult) -> float:
    """Reading what the operator writes for every Agent (results are built on first read)."""
    start = clock()
    for agent in result.agents:
        _ = agent.phases, agent.env, agent.conditions, agent.last_unschedulable
    return clock() - start


def bindings_digest(result: ScheduleResult) -> str:
    """A hash of every Agent's bindings in pass order: each phase's outcome, Model, provider."""
    digest = hashlib.sha256()
    for agent in result.agents:
        phases = [(name, found.outcome.value, found.model, found.provider)
                  for name, found in agent.phases.items()]
        digest.update(repr((agent.namespace, agent.name, phases)).encode())
    return digest.hexdigest()[:16]


@dataclass
class Timings:
    """The best of each figure over the runs, and the last result."""

    floor: float = float("inf")
    per_agent: float = float("inf")
    best: float = float("inf")
    read: float = float("inf")
    filing: float = float("inf")  # filing the Agents in a roster
    filed: float = float("inf")  # a pass over a snapshot given that roster
    result: ScheduleResult | None = None
    filed_result: ScheduleResult | None = None


def measure(bundle: Bundle, repeat: int) -> Timings:
    """Best floor, per-Agent floor, pass, read, filing and filed-pass times over
    ``repeat`` alternating runs, and the last result."""
    # Floor and pass alternate, so that both see the same machine when it is shared.
    found = Timings()
    for _ in range(repeat):
        found.floor = min(found.floor, floor_seconds(bundle))
        found.per_agent = min(found.per_agent, agent_floor_seconds(bundle))
        start = clock()
        found.result = schedule_bundle(bundle, now=NOW)
        found.best = min(found.best, clock() - start)
        found.read = min(found.read, read_seconds(found.result))
        start = clock()
        roster = AgentRoster(bundle.agents)
        for segment in roster.segments():
            _ = segment.agents  # filed in name order, as a kept roster is after one pass
        found.filing = min(found.filing, clock() - start)
        # The snapshot is built inside the timing, as schedule_bundle builds it above.
        start = clock()
        found.filed_result = schedule_bundle(
            ClusterSnapshot.from_bundle(bundle, roster=roster), now=NOW
        )
        found.filed = min(found.filed, clock() - start)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5000)
    parser.add_argument("--models", type=int, default=500)
    parser.add_argument("--providers", type=int, default=100)
    parser.add_argument("--policies", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="time with the wall clock (default) or this process's CPU time",
    )
    parser.add_argument(
        "--scale", type=int, default=10,
        help="also run agents and providers times this (0: skip); prints ratioToFloorAt10x",
    )
    args = parser.parse_args()
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    bundle = generate(
        random.Random(args.seed),
        agents=args.agents,
        models=args.models,
        providers=args.providers,
        policies=args.policies,
    )
    print(
        f"cluster: {len(bundle.agents)} agents, {len(bundle.models)} models, "
        f"{len(bundle.providers)} providers, {len(bundle.policies)} policies"
    )
    timings = measure(bundle, args.repeat)
    floor, best, read, result = timings.floor, timings.best, timings.read, timings.result
    assert result is not None
    outcomes = Counter(p.outcome.value for a in result.agents for p in a.phases.values())
    providers_used = len({a.phases["mulling"].provider for a in result.agents} - {None})
    print(
        f"outcomes per phase: {dict(sorted(outcomes.items()))}; "
        f"mulling spread over {providers_used} providers; {len(result.events)} events"
    )
    print(f"floor (require selectors × models): {floor * 1000:.1f} ms")
    print(f"scheduling pass: {best * 1000:.1f} ms")
    print(
        f"reading every agent's phases, env and conditions afterwards: {read * 1000:.1f} ms "
        "(built on first read from the decisions the pass shares)"
    )
    agents_per_second = len(result.agents) / best
    ratio = best / floor
    print(f"agents bound per second (both phases): {agents_per_second:,.0f}")
    print(f"ratio to floor: {ratio:.2f}x")
    figures: dict[str, float | str] = {
        "agentsPerSecond": round(agents_per_second, 1), "ratioToFloor": round(ratio, 3),
        "bindingsDigest": bindings_digest(result),
    }
    if args.scale:
        large = generate(
            random.Random(args.seed),
            agents=args.agents * args.scale,
            models=args.models,
            providers=args.providers * args.scale,
            policies=args.policies,
        )
        at_scale = measure(large, max(1, args.repeat // 2))
        floor_l, best_l, result_l = at_scale.floor, at_scale.best, at_scale.result
        assert result_l is not None
        agent_floor_l = floor_l + at_scale.per_agent
        print(
            f"at {args.scale}x ({len(large.agents)} agents, {len(large.providers)} providers): "
            f"floor {floor_l * 1000:.1f} ms, pass {best_l * 1000:.1f} ms, "
            f"ratio to floor {best_l / floor_l:.2f}x; with each Agent read and emitted once "
            f"{agent_floor_l * 1000:.1f} ms, ratio {best_l / agent_floor_l:.2f}x"
        )
        figures[f"ratioToFloorAt{args.scale}x"] = round(best_l / floor_l, 3)
        figures[f"agentsPerSecondAt{args.scale}x"] = round(len(result_l.agents) / best_l, 1)
        figures[f"ratioToAgentFloorAt{args.scale}x"] = round(best_l / agent_floor_l, 3)
        print(
            f"at {args.scale}x, filing the Agents in a roster {at_scale.filing * 1000:.1f} ms; "
            f"a pass given that roster {at_scale.filed * 1000:.1f} ms, "
            f"ratio to floor {at_scale.filed / floor_l:.2f}x"
        )
        figures[f"ratioToFloorAt{args.scale}xFiled"] = round(at_scale.filed / floor_l, 3)
        assert at_scale.filed_result is not None
        digest = bindings_digest(result_l)
        same = bindings_digest(at_scale.filed_result) == digest
        print(f"at {args.scale}x, bindings {digest}; the pass given the roster binds alike: {same}")
        figures["sameBindingsFiled"] = same
        figures[f"bindingsDigestAt{args.scale}x"] = digest
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
