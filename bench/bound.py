"""How much the lower bound on mean wait can say, on two traces where it is known to bite.

* **Tolerance**: on ``homelab`` (its own seed and duration), the bound counting only the
  candidates some compared policy may use (within the runtime's tolerance) against the
  bound that lets every listed candidate absorb queueing.
* **Slot-starved trace**: one card with two slots, bursts of three, seeds 1–3 (the
  trace of ``tests/sim/test_bound.py``): the bound, its first-load argument alone, and
  the measured mean waits of kubemoot, static and least-busy, with the ratio
  bound ÷ measured mean (1 would be a bound that meets the best policy).

Deterministic: the figures depend on the code and the seeds, not on the machine.
Human-readable lines first; the last line is one JSON object:
``{"homelabBound": …, "homelabBoundAllCandidates": …, "starved": [{"seed": …, …}]}``.
Run: ``.venv/bin/python bench/bound.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kubemoot.sim.bound import lower_bound  # noqa: E402
from kubemoot.sim.scenario import Scenario, load_scenario  # noqa: E402
from kubemoot.sim.simulation import simulate  # noqa: E402
from kubemoot.sim.workload import build_trace  # noqa: E402

STARVED_POLICIES = ("kubemoot", "static", "least-busy")
STARVED_SEEDS = (1, 2, 3)


def _starved() -> Scenario:
    # The trace tests/sim/test_bound.py checks: its waits are slot queueing.
    return load_scenario(ROOT / "examples" / "scenarios" / "slot-starved.yaml")


def _homelab() -> dict[str, float]:
    scenario = load_scenario(ROOT / "examples" / "scenarios" / "homelab.yaml")
    trace = build_trace(scenario, seed=scenario.spec.seed)
    within = lower_bound(scenario, trace).mean_wait
    everything = lower_bound(scenario, trace, tolerance=1000.0).mean_wait
    print(f"homelab bound: {within:.2f} s counting candidates within the tolerance, "
          f"{everything:.2f} s letting every listed candidate absorb queueing")
    return {"homelabBound": round(within, 3), "homelabBoundAllCandidates": round(everything, 3)}


def _starved_runs() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for seed in STARVED_SEEDS:
        result = simulate(_starved(), seed=seed, policies=list(STARVED_POLICIES))
        bound = result.bound
        means = {run.report.policy: run.report.wait["mean"] for run in result.runs}
        best = min(means.values())
        print(f"slot-starved seed {seed}: bound {bound.mean_wait:.2f} s (first loads alone "
              f"{bound.first_load_mean:.2f} s); measured "
              + ", ".join(f"{p} {m:.1f} s" for p, m in means.items())
              + f"; bound ÷ best measured {bound.mean_wait / best:.2f}")
        rows.append({"seed": seed, "bound": round(bound.mean_wait, 3),
                     "firstLoadBound": round(bound.first_load_mean, 3),
                     "measured": {p: round(m, 3) for p, m in means.items()},
                     "boundToBestMeasured": round(bound.mean_wait / best, 3)})
    return rows


def main() -> None:
    figures: dict[str, Any] = _homelab()
    figures["starved"] = _starved_runs()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
