"""The benchmarks keep running: each, at a small size, ends with its JSON figures line.

These are smoke tests, not performance tests: no timing is asserted (DESIGN's rule for
unit tests); only that every figure an issue asks for is printed, and that the
invariants a bench reports (overcommits) hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(script: str, *args: str) -> tuple[dict[str, Any], str]:
    """Run ``bench/<script>``; its last line's figures and everything it printed."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures, done.stdout



@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args", "keys"),
    [
        ("schedule.py",
         ["--agents", "200", "--models", "50", "--providers", "10", "--policies", "5",
          "--repeat", "1"],
         {"agentsPerSecond", "ratioToFloor", "ratioToFloorAt10x", "agentsPerSecondAt10x",
          "ratioToAgentFloorAt10x", "ratioToFloorAt10xFiled", "sameBindingsFiled"}),
        pytest.param(
            "kv.py",
            ["--seconds", "0.5", "--claimers", "4", "--processes", "1", "--samples", "50",
             "--many-processes", "2"],
            {"overcommits", "uncontendedP99Ratio", "contendedClaimsPerSecond",
             "contendedP99Ms", "fairness", "fairnessProcesses", "claimsPerSecondProcesses",
             "overcommitsProcesses", "workerCpuMsPerClaim", "workerCpuMsPerClaimProcesses"},
            marks=pytest.mark.nats,  # the bench starts its own nats-server
        ),
        pytest.param("place.py",
                     ["--calls", "50", "--nats-calls", "20", "--large-providers", "100"],
                     {"embeddedP99Ms", "embeddedP99MsAt1000Providers",
                      "embeddedCpuP99MsAt1000Providers", "natsP99Ratio",
                      "embeddedPythonCallsPerCall", "natsPythonCallsPerCall",
                      "natsPythonCallsPerFloor", "natsLoopTurnsPerCall",
                      "natsLoopTurnsPerFloor", "natsMessagesReceivedBeforeReturnPerCall",
                      "natsReleaseHeardAfterReturnP99Ms"},
                     marks=pytest.mark.nats),
        pytest.param("gateway.py", ["--calls", "20", "--seconds", "0.5", "--clients", "4",
                                    "--requests", "20", "--litellm", "off"],
                     {"addedP50Ms", "addedP99Ms", "throughputRatio", "overcommits",
                      "addedP50MsOpenAI", "throughputRatioOpenAI", "gatewayCpuMsPerCall",
                      "generatorCpuMsPerCall", "generatorCpuMsPerCallOpenAI"},
                     marks=pytest.mark.nats),
        ("gateway.py", ["--count-calls", "20"],
         {"pythonCallsPerCall", "pythonCallsPerCallOpenAI", "loopAsksPerCall"}),
        ("gateway.py", ["--cpu-only", "--seconds", "0.5", "--clients", "4"],
         {"gatewayUserMsPerCall", "gatewaySystemMsPerCall", "gatewayUserMsPerCallOpenAI",
          "gatewaySystemMsPerCallOpenAI"}),
        ("quality.py", ["--optimum-seconds", "0.5"],
         {"meanWaitRatioToBestBaseline", "meanWaitRatioToOptimum",
          "coldLoadRatioToRoundRobin", "meanWaitRatioToLowerBound",
          "simSecondsFor100kCalls"}),
        ("spec_floor.py", ["--scenarios", "long-discussion", "--seconds", "0.5"],
         {"specFloorRatioToOptimum"}),
        ("bound.py", [], {"homelabBound", "homelabBoundAllCandidates"}),
        ("simcpu.py", ["--scenario", "homelab", "--duration", "300"],
         {"pythonCalls", "cpuSecondsFor100kCalls", "servedCalls"}),
        ("operator_batch.py", ["--agents", "200", "--providers", "10", "--repeat", "1"],
         {"agentByAgentMs", "keptRosterBatchMs", "batchSpeedup", "sameBindings"}),
    ],
)
def test_bench_prints_its_figures_as_the_last_line(
    script: str, args: list[str], keys: set[str]
) -> None:
    figures, printed = _bench(script, *args)
    assert keys <= figures.keys()
    assert all(isinstance(figures[k], int | float) for k in keys)
    for key in ("overcommits", "overcommitsProcesses"):
        if key in figures:
            assert figures[key] == 0, printed[-3000:]
    if "sameBindings" in figures:  # the operator's batch binds as Agent by Agent did
        assert figures["sameBindings"] is True
    if "sameBindingsFiled" in figures:  # a pass over a kept roster binds as a fresh one
        assert figures["sameBindingsFiled"] is True


def test_simcpu_hashes_the_decisions_of_each_scenario() -> None:
    """The decisions digest is what a speed-only change is checked against: the same
    scenarios give the same digest run after run, and different scenarios differ."""
    def digests() -> dict[str, Any]:
        return _bench("simcpu.py", "--scenario", "homelab", "--duration", "300",
                      "--decisions", "homelab,memory-tight")[0]

    first, second = digests(), digests()
    assert first["decisions"] == second["decisions"]
    by_scenario = first["decisionsByScenario"]
    assert isinstance(by_scenario, dict)
    assert by_scenario["homelab"] != by_scenario["memory-tight"]


def test_quality_bench_gives_kubemoot_s_wait_per_seed() -> None:
    """``--seeds``: a change that helps on the bench's seed alone is checked over several."""
    figures, _printed = _bench("quality.py", "--scenarios", "homelab", "--duration", "300",
                               "--seeds", "1,2")
    homelab = figures["perScenario"]["homelab"]
    assert figures["seeds"] == [1, 2] and set(homelab["meanWaitSeconds"]) == {"1", "2"}
    waits = homelab["meanWaitSeconds"].values()
    assert homelab["meanOverSeeds"] == pytest.approx(sum(waits) / 2, abs=1e-4)


@pytest.mark.slow
def test_quality_bench_lists_a_cut_call_by_call() -> None:
    """``--cut-calls``: kubemoot's schedule beside the selected optimum's, whose totals
    are the two mean waits the bench divides, times the cut's calls."""
    figures, printed = _bench("quality.py", "--scenarios", "homelab", "--duration", "300",
                              "--optimum-seconds", "0.5", "--cut-calls")
    header = next(line for line in printed.splitlines() if "call by call" in line)
    cut = figures["perScenario"]["homelab"]["cut"]
    calls = cut["cardsModelsCalls"][2]
    ours = float(header.split("total wait kubemoot ")[1].split(" s")[0])
    theirs = float(header.split("selected optimum ")[1].split(" s")[0])
    assert ours == pytest.approx(cut["kubemootMeanWaitSeconds"] * calls, abs=0.1)
    assert theirs == pytest.approx(cut["selectedOptimum"]["meanWaitSeconds"] * calls, abs=0.1)
    assert "kubemoot's loads: " in printed and "by band" in header
    assert "the selected optimum's copies, by their first call's start: " in printed


@pytest.mark.slow
def test_simcpu_counts_the_runs_bytecode() -> None:
    """``--opcodes``: a count that repeats exactly, and where it went by function."""
    def counted() -> dict[str, Any]:
        return _bench("simcpu.py", "--scenario", "homelab", "--duration", "120",
                      "--opcodes", "3")[0]

    first, second = counted(), counted()
    assert first["pythonOpcodes"] == second["pythonOpcodes"] > 0
    rows = first["opcodesByFunction"]
    assert len(rows) == 3 and rows[0][1] >= rows[1][1] >= rows[2][1] > 0
    assert "VirtualTimeLoop" in " ".join(row[3] for row in rows)
