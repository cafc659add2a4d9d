"""Placement quality: homelab and fleet-16 with every policy.

Prints each scenario's comparison table, then as its last line one JSON object:

* ``meanWaitRatioToBestBaseline`` — kubemoot's mean wait over the best baseline's
  (worst of the two scenarios; goal ≤ 0.6);
* ``coldLoadRatioToRoundRobin`` — kubemoot's cold loads over round-robin's (goal ≤ 0.5);
* ``meanWaitRatioToLowerBound`` — kubemoot's mean wait over the trace's lower bound
  (goal ≤ 1.5);
* ``simSecondsFor100kCalls`` — wall seconds the kubemoot run would need for 100,000
  calls at the rate measured on fleet-16 (extrapolated linearly; goal ≤ 60).

Run: ``.venv/bin/python bench/sim.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from kubemoot.sim import load_scenario, simulate
from kubemoot.sim.report import comparison_table

HERE = Path(__file__).resolve().parents[1] / "examples" / "scenarios"


def main() -> None:
    console = Console(width=100)
    wait_ratio = load_ratio = bound_ratio = 0.0
    per_call = 0.0
    for name in ("homelab", "fleet-16"):
        result = simulate(load_scenario(HERE / f"{name}.yaml"))
        console.print(comparison_table(result))
        by = {run.report.policy: run.report for run in result.runs}
        ours = by.pop("kubemoot")
        best = min(by.values(), key=lambda r: r.wait["mean"])
        console.print(f"{name}: best baseline by mean wait is {best.policy} "
                      f"({best.wait['mean']:.2f} s); kubemoot {ours.wait['mean']:.2f} s; "
                      f"kubemoot run took {ours.wall_seconds:.1f} s for {ours.calls} calls")
        wait_ratio = max(wait_ratio, ours.wait["mean"] / max(best.wait["mean"], 1e-9))
        load_ratio = max(load_ratio, ours.cold_loads / max(by["round-robin"].cold_loads, 1))
        bound_ratio = max(bound_ratio, ours.wait["mean"] / max(result.bound.mean_wait, 1e-9))
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
