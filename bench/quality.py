"""Placement quality: homelab and fleet-16, every policy on the same trace.

Prints each scenario's comparison table and a line per scenario explaining the ratios,
then, as its last line, one JSON object with the worst of the two scenarios for each
ratio (issue 8):

* ``meanWaitRatioToBestBaseline`` — kubemoot's mean wait over the best baseline's
  (goal ≤ 0.6);
* ``coldLoadRatioToRoundRobin`` — kubemoot's cold loads over round-robin's (goal ≤ 0.5);
* ``meanWaitRatioToLowerBound`` — kubemoot's mean wait over the trace's lower bound
  (goal ≤ 1.5);
* ``simSecondsFor100kCalls`` — wall seconds of the kubemoot run per call on fleet-16
  (the larger scenario), times 100,000 (goal ≤ 60).

The baselines run exactly as :mod:`kubemoot.sim.policies` defines them; nothing here
tunes them. Run: ``.venv/bin/python bench/quality.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rich.console import Console  # noqa: E402

from kubemoot.sim import load_scenario, simulate  # noqa: E402
from kubemoot.sim.report import comparison_table  # noqa: E402

SCENARIOS = ROOT / "examples" / "scenarios"


def main() -> None:
    console = Console(width=110)
    wait_ratio = load_ratio = bound_ratio = 0.0
    per_call = 0.0
    for name in ("homelab", "fleet-16"):
        result = simulate(load_scenario(SCENARIOS / f"{name}.yaml"))
        console.print(comparison_table(result))
        by = {run.report.policy: run.report for run in result.runs}
        ours = by.pop("kubemoot")
        best = min(by.values(), key=lambda r: r.wait["mean"])
        ratios = (
            ours.wait["mean"] / max(best.wait["mean"], 1e-9),
            ours.cold_loads / max(by["round-robin"].cold_loads, 1),
            ours.wait["mean"] / max(result.bound.mean_wait, 1e-9),
        )
        console.print(
            f"{name}: kubemoot mean wait {ours.wait['mean']:.2f} s, best baseline "
            f"{best.policy} {best.wait['mean']:.2f} s (ratio {ratios[0]:.3f}); cold loads "
            f"{ours.cold_loads} vs round-robin {by['round-robin'].cold_loads} "
            f"(ratio {ratios[1]:.3f}); lower bound {result.bound.mean_wait:.3f} s "
            f"(ratio {ratios[2]:.1f}); stood aside {sum(ours.stood_aside.values())}; "
            f"kubemoot run {ours.wall_seconds:.2f} s for {ours.calls} calls"
        )
        wait_ratio = max(wait_ratio, ratios[0])
        load_ratio = max(load_ratio, ratios[1])
        bound_ratio = max(bound_ratio, ratios[2])
        if name == "fleet-16":
            per_call = ours.wall_seconds / max(ours.calls, 1)
    print(json.dumps({
        "meanWaitRatioToBestBaseline": round(wait_ratio, 3),
        "coldLoadRatioToRoundRobin": round(load_ratio, 3),
        "meanWaitRatioToLowerBound": round(bound_ratio, 3),
        "simSecondsFor100kCalls": round(per_call * 100_000, 1),
    }))


if __name__ == "__main__":
    main()
