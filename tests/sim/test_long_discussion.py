"""The long-discussion workload: every call of a thread re-sends the thread so far."""

from __future__ import annotations

import itertools
from pathlib import Path

from kubemoot.sim import build_trace, load_scenario
from kubemoot.sim.simulation import run_policy

SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "long-discussion.yaml"


def test_each_call_resends_its_thread_and_shares_all_but_the_newest_step() -> None:
    trace = build_trace(load_scenario(SCENARIO))
    turn = trace.discussions[0].turns[0]
    prompts = [call.prompt for step in turn.steps for call in step.calls]
    assert all(p is not None for p in prompts)
    assert [p.tokens for p in prompts if p] == [1500 + 1200 * k for k in range(10)]
    for earlier, later in itertools.pairwise(prompts):
        assert earlier is not None and later is not None
        assert later.shared_prefix(earlier) == earlier.tokens
    other = trace.discussions[0].turns[1].steps[1].calls[0].prompt
    assert other is not None and prompts[1] is not None
    assert other.shared_prefix(prompts[1]) == 0  # another agent's thread shares nothing
    assert all(c.prompt_tokens == c.prompt.tokens for c in trace.calls() if c.prompt)


def test_prefill_is_part_of_every_policy_s_wait() -> None:
    scenario = load_scenario(SCENARIO).with_duration(900)
    trace = build_trace(scenario)
    for policy in ("kubemoot", "round-robin"):
        report = run_policy(scenario, trace, policy, seed=1).report
        assert report.wait_parts["prefill"] > 0, policy
        # the parts add up to the wait (each rounded to the millisecond)
        assert abs(sum(report.wait_parts.values()) - report.wait["mean"]) < 0.01, policy
