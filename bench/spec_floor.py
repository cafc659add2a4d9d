"""How close to the offline optimum any runtime that follows the spec can come.

``bench/quality.py`` divides kubemoot's mean wait on each scenario's 40-call cut by the
cut's offline optimum, which knows every call in advance and may load a model long
before anyone wants it. The spec forbids that: every load must have a selected agent
behind it. This bench solves each cut once more under the weakest reading of
that rule (:func:`kubemoot.sim.optimum.solve` with ``spec_floor``: a load of a model
starts no earlier than the first selection of an agent of any call that could run on
it) and prints, per scenario, the solver's proven lower bound under that rule divided
by the optimum that ``bench/quality.py`` divides by. No placement that follows the spec
can have a smaller ratio to the optimum on that cut, whatever it does.

The floor allows more reloads of a model on a card than the bench's optimum
(``--loads-per-copy``, default 4; the optimum keeps the bench's 2) so that the model's
size limit cannot be what holds the floor up. Run:
``.venv/bin/python bench/spec_floor.py [--scenarios a,b] [--seconds S]``. The last line
is one JSON object: ``specFloorRatioToOptimum`` (the largest over the scenarios: the
best ``meanWaitRatioToOptimum`` a spec-following runtime could reach), and per scenario
the optimum, the floor (its schedule's mean wait, its proven bound, whether proven) and
kubemoot's mean wait over the floor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from quality import DEFAULT_SCENARIOS, OPTIMUM_TIME_LIMIT, SCENARIOS, cut_optima  # noqa: E402

from kubemoot.sim import load_scenario  # noqa: E402
from kubemoot.sim.optimum import solve  # noqa: E402


def floor_of(name: str, seconds: float, loads_per_copy: int) -> dict[str, Any]:
    """One scenario's cut: the bench's optimum, the spec floor and kubemoot over both."""
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    # The cut and its optimum exactly as bench/quality.py finds them (same searches,
    # same chain), so the ratio printed here divides by the same figure.
    found = cut_optima(scenario, scenario.spec.seed, seconds)
    optimum, runs = found.optimum, found.runs
    floor = solve(found.cut, time_limit_seconds=seconds, hint=found.hint, spec_floor=True,
                  loads_per_copy=loads_per_copy)
    ours = runs["kubemoot"].report.wait["mean"]
    ratio = floor.bound_mean_wait / max(optimum.mean_wait, 1e-9)
    def proven(o: Any) -> str:
        return "proven" if o.proven else "not proven"

    print(f"{name}: optimum {optimum.mean_wait:.3f} s ({proven(optimum)}); spec floor "
          f"{floor.mean_wait:.3f} s, proven bound {floor.bound_mean_wait:.3f} s "
          f"({proven(floor)}, {loads_per_copy} loads per copy); floor ÷ optimum {ratio:.2f}; "
          f"kubemoot {ours:.3f} s = {ours / max(optimum.mean_wait, 1e-9):.2f} × optimum, "
          f"{ours / max(floor.bound_mean_wait, 1e-9):.2f} × the floor's bound", flush=True)
    return {
        "optimum": optimum.to_json(),
        "specFloor": floor.to_json(),
        "specFloorRatioToOptimum": round(ratio, 3),
        "kubemootMeanWaitSeconds": round(ours, 3),
        "kubemootRatioToSpecFloorBound": round(ours / max(floor.bound_mean_wait, 1e-9), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help="comma-separated scenario names from examples/scenarios")
    parser.add_argument("--seconds", type=float, default=OPTIMUM_TIME_LIMIT,
                        help="the solver's deterministic time per search (as bench/quality.py)")
    parser.add_argument("--loads-per-copy", type=int, default=4,
                        help="how often the floor may load one model on one card")
    args = parser.parse_args()
    per = {name: floor_of(name, args.seconds, args.loads_per_copy)
           for name in args.scenarios.split(",") if name}
    print(json.dumps({
        "specFloorRatioToOptimum": max(f["specFloorRatioToOptimum"] for f in per.values()),
        "perScenario": per,
    }))


if __name__ == "__main__":
    main()
