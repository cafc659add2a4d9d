"""What the demo's crew talks about, and how several discussions run at once.

The questions and tools are canned and deterministic (the tools return fixed text;
the engines are emulated), so a given seed always asks the same questions, selects the
same members and staggers the threads the same way. The contention the runtime then
resolves — warm reuse, cold loads, queueing, evictions — is real.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

from kubemoot.agent.discussion import AgentProfile, Coordinator, DiscussionResult, Thread
from kubemoot.agent.toolloop import Tool

__all__ = ["DEMO_QUESTIONS", "demo_toolbox", "demo_tools", "run_discussions"]

DEMO_QUESTIONS: tuple[str, ...] = (
    "Checkout pods restart every few minutes. Use kubectl_get and say what we should do.",
    "Payments API latency doubled since noon; look at promql_query and propose a fix.",
    "The nightly batch job failed. Read logs_tail and tell us why.",
    "Should the search service move to the new node pool before the sale?",
    "Disk pressure on rig-b: what fills it? Check logs_tail and kubectl_get.",
    "Is it safe to upgrade the ingress controller this week?",
    "Error budget for the orders service is nearly spent; promql_query the burn rate.",
    "A deployment rollout is stuck at 50 percent. kubectl_get the replica sets.",
    "Which alerts fired most last week, and which can we silence?",
    "Memory of the cache tier creeps up daily; leak or normal growth?",
)


def _canned(text: str) -> Any:
    async def handler(arguments: Mapping[str, Any]) -> str:
        return text

    return handler


def demo_toolbox() -> dict[str, Tool]:
    """The demo's tools by name: what an Agent's ``enabledTools`` may name (fixed
    answers: nothing is queried)."""
    tools = (
        Tool("kubectl_get", "List Kubernetes objects",
             _canned("NAME READY STATUS RESTARTS\ncheckout-7d9 1/1 Running 14\n")),
        Tool("promql_query", "Run a PromQL query",
             _canned("p99 latency 1.8s (was 0.9s); error rate 0.4%")),
        Tool("logs_tail", "Tail recent log lines",
             _canned("OOMKilled: container exceeded 512Mi at 02:14")),
        # the tools deploy/crew's Agents enable
        Tool("kubectl_describe", "Describe one Kubernetes object",
             _canned("Last State: Terminated (OOMKilled), Exit Code 137, Restart Count 14")),
        Tool("kubectl_logs", "Print a container's recent logs",
             _canned("java.lang.OutOfMemoryError: Java heap space")),
        Tool("loki_query", "Run a LogQL query",
             _canned("{app=\"checkout\"} |= \"OOM\": 14 lines in the last hour")),
    )
    return {tool.name: tool for tool in tools}


def demo_tools() -> dict[str, tuple[Tool, ...]]:
    """The homelab crew's tools by Agent name."""
    box = demo_toolbox()
    return {
        "kubectl-agent": (box["kubectl_get"],),
        "prometheus-agent": (box["promql_query"],),
        "logs-agent": (box["logs_tail"],),
    }


async def run_discussions(
    coordinator: Coordinator,
    members: Sequence[AgentProfile],
    *,
    count: int,
    seed: int,
    stagger_seconds: float,
) -> list[DiscussionResult]:
    """``count`` discussions, started at seeded offsets within ``stagger_seconds``.

    Cancelling this cancels every discussion and returns only once all have ended.
    """
    rng = random.Random(seed)
    questions = list(DEMO_QUESTIONS)
    rng.shuffle(questions)
    plans: list[tuple[float, Thread, list[AgentProfile]]] = []
    for index in range(count):
        thread = Thread(f"thread-{index + 1}", questions[index % len(questions)])
        size = min(len(members), rng.choice((2, 3)))
        chosen = sorted(rng.sample(list(members), size), key=lambda m: m.id)
        plans.append((rng.uniform(0.0, stagger_seconds), thread, chosen))
    clock = coordinator.runtime.clock

    async def one(offset: float, thread: Thread, chosen: list[AgentProfile]) -> DiscussionResult:
        await clock.sleep(offset)
        return await coordinator.discuss(thread, chosen)

    tasks = [asyncio.ensure_future(one(*plan)) for plan in plans]
    try:
        return list(await asyncio.gather(*tasks))
    except asyncio.CancelledError:
        raise  # the gather has already passed the cancellation on to every thread
    except BaseException:
        # A failed thread: stop the others. (Never cancel twice: a second cancellation
        # would interrupt a thread that is giving its tickets back.)
        for task in tasks:
            task.cancel()
        raise
    finally:
        # A plain gather stops waiting at the first cancelled or failed thread; the
        # others must still end (and give their tickets back) before the caller goes on
        # to close the runtime and the store under them.
        await asyncio.gather(*tasks, return_exceptions=True)
