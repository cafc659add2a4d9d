"""The bounded decision summary an Agent's status keeps per phase (DESIGN §4)."""

from __future__ import annotations

import pytest

from kubemoot.api.agent import SUMMARY_FAILURES, SUMMARY_TEXT
from kubemoot.testing.builders import agent, model, policy, provider, rule

from .conftest import run

TOOLS = {"capability/tool-calling": "true"}


@pytest.mark.parametrize("untooled", [1, 5])
def test_counts_and_the_gates_that_failed_most_come_first(untooled: int) -> None:
    models = [
        model("fits", provider="big", vram_mib=4096, labels=TOOLS),
        model("too-large", provider="small", vram_mib=30000, labels=TOOLS),
        model("nowhere", provider="missing", vram_mib=1024, labels=TOOLS),
        *(model(f"untooled-{i}", provider="big", vram_mib=1024) for i in range(untooled)),
    ]
    result = run(models=models,
                 providers=[provider("big", vram_total_mib=32768),
                            provider("small", vram_total_mib=8192)],
                 agents=[agent("a", crew="crew")],
                 policies=[policy("crew", crew_ref="crew",
                                  rules=[rule("mulling", require=TOOLS)])])
    mulling = result.agents[0].phases["mulling"]
    summary = mulling.summary(policy_version="sha256:x")
    assert (summary.feasible, summary.uncertain, summary.failed) == (1, 0, 2 + untooled)
    assert len(summary.top_failures) <= SUMMARY_FAILURES
    counts = [(f.gate, f.count) for f in summary.top_failures]
    if untooled > 1:
        assert counts[0] == ("Require", untooled)
    assert sorted(counts, key=lambda c: -c[1]) == counts  # most first
    assert {g for g, _ in counts} == {"Require", "VRAM", "ProviderReady"}
    assert all(len(f.reason) <= SUMMARY_TEXT for f in summary.top_failures)
    assert summary.policy_version == "sha256:x"
    assert summary.scheduler_version == mulling.decision.scheduler_version
    # what the operator writes: the same summary, in the phase's status entry
    written = result.agents[0].scheduling(summaries=True).phases["mulling"].decision
    assert written is not None and written.failed == summary.failed
    assert written.policy_version is not None and written.policy_version.startswith("sha256:")
    # kubemoot schedule leaves it out (it prints the full record instead)
    assert result.agents[0].scheduling().phases["mulling"].decision is None
