"""Benchmark of the operator's batch of every Agent: one pass over a kept roster.

When a change concerns every Agent (a KubemootConfig, a provider or Model every crew
may use), the operator schedules them all in one batch. It now files the batch in a
roster it keeps between batches (:class:`kubemoot.operator.batch.KeptRoster`) and
binds it in one pass (``SchedulingPass.schedule_all``) in (namespace, name) order.
Before, it sorted the batch by ``namespace/name`` string and called
``SchedulingPass.schedule`` Agent by Agent; that loop is reproduced here as the
reference. Both read every Agent's result, as the operator does to write it; the Kubernetes
writes themselves are left out. The cluster is ``bench/schedule.py``'s at ten times the
default (50,000 Agents, 1,000 providers). The kept roster has filed every Agent once before
the timed runs, as it has after the operator's first batch. Prints each time (best of
``--repeat``, the two alternating) and checks that both give the same bindings in the same
order. The last line is one JSON object:
``{"agentByAgentMs": …, "keptRosterBatchMs": …, "batchSpeedup": …, "sameBindings": …}``

    python bench/operator_batch.py [--agents 50000] [--providers 1000] [--repeat 5]
                                   [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

from schedule import NOW, generate  # bench/schedule.py: the same cluster

from kubemoot.operator.batch import KeptRoster
from kubemoot.operator.view import ClusterView, agent_key
from kubemoot.scheduling.result import AgentResult
from kubemoot.scheduling.scheduler import SchedulingPass, collector_paused


def bindings(results: list[AgentResult]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (agent_key(result.agent),
         {phase: (found.model, found.outcome) for phase, found in result.phases.items()})
        for result in results
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=50000)
    parser.add_argument("--providers", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    bundle = generate(random.Random(args.seed), agents=args.agents, models=500,
                      providers=args.providers, policies=50)
    view = ClusterView(
        models={model.metadata.name: model for model in bundle.models},
        providers={provider.metadata.name: provider for provider in bundle.providers},
        agents={agent_key(agent): agent for agent in bundle.agents},
        policies={f"{p.namespace}/{p.metadata.name}": p for p in bundle.policies},
    )
    keys = set(view.agents)
    # As the operator does: the batch is left out of the counts it binds against.
    snapshot = view.snapshot(exclude=keys, assumed={})
    kept = KeptRoster()

    def agent_by_agent() -> list[AgentResult]:
        with collector_paused():
            agents = sorted((view.agents[key] for key in keys), key=agent_key)
            scheduling = SchedulingPass(snapshot, now=NOW)
            return [scheduling.schedule(agent) for agent in agents]

    def kept_roster() -> list[AgentResult]:
        with collector_paused():
            batch = {key: view.agents[key] for key in keys}
            scheduling = SchedulingPass(snapshot, now=NOW)
            scheduling.schedule_all(kept.file(view.agents, batch))
            return list(scheduling.results)

    kept_roster()  # the first batch files every Agent
    best = {"agentByAgent": float("inf"), "keptRoster": float("inf")}
    found: dict[str, list[AgentResult]] = {}
    runs: dict[str, Callable[[], list[AgentResult]]] = {
        "agentByAgent": agent_by_agent, "keptRoster": kept_roster,
    }
    for _ in range(args.repeat):
        for name, run in runs.items():
            start = clock()
            found[name] = run()
            best[name] = min(best[name], clock() - start)
    same = bindings(found["agentByAgent"]) == bindings(found["keptRoster"])
    print(f"cluster: {len(view.agents)} agents, {len(view.providers)} providers")
    print(f"Agent by Agent in namespace/name string order: {best['agentByAgent'] * 1000:.1f} ms")
    print(f"one pass over the kept roster: {best['keptRoster'] * 1000:.1f} ms")
    print(f"same bindings in the same order: {same}")
    print(json.dumps({
        "agentByAgentMs": round(best["agentByAgent"] * 1000, 1),
        "keptRosterBatchMs": round(best["keptRoster"] * 1000, 1),
        "batchSpeedup": round(best["agentByAgent"] / best["keptRoster"], 2),
        "sameBindings": same,
    }))


if __name__ == "__main__":
    main()
