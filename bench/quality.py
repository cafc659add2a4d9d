"""Placement quality: every policy on the same trace, over five workloads.

Scenarios (``examples/scenarios``): ``homelab`` (two cards), ``fleet-16`` (sixteen
cards, twelve models), ``memory-tight`` (the preferred models need more memory than
the cards have, so eviction choices matter), ``burst-fanout`` (agents fan out eight
calls at once to one model, so the timing of a second copy matters) and
``long-discussion`` (each agent re-sends a growing history, so where a call lands
decides how much of its prompt is evaluated again).

For each scenario it prints the comparison table, where the mean wait goes (slot
queueing, load, eviction, memory; see :mod:`kubemoot.sim.phases`), which calls
kubemoot made wait longer than herd-like did, and a line of ratios. The last line is
one JSON object with, for each ratio, the worst scenario's value (and every scenario's
under ``perScenario``):

* ``meanWaitRatioToBestBaseline`` — kubemoot's mean wait over the best baseline's
  (goal ≤ 0.6);
* ``coldLoadRatioToRoundRobin`` — kubemoot's cold loads over round-robin's (goal ≤ 0.5);
* ``meanWaitRatioToOptimum`` — on a small trace cut from each scenario (a few cards,
  models and calls; :mod:`kubemoot.sim.cut`), kubemoot's mean wait over the offline
  optimum's (:mod:`kubemoot.sim.optimum`, OR-Tools CP-SAT; goal ≤ 1.3). When the solver
  did not prove its schedule optimal within its time limit, the divisor is the best
  schedule it found, and ``perScenario`` also gives the ratio to its proven bound;
* ``meanWaitRatioToReactiveOptimum`` — the same over an optimum that may not start a
  load before some call it serves was issued (no online policy can have a model ready
  before anyone asked for it): how much of the gap is foresight;
* ``meanWaitRatioToSelectedOptimum`` — the same over an optimum that may not start a
  load before the agent of some call it serves was selected: the foresight the spec
  gives an online runtime (planning at selection), between the two above;
* ``meanWaitRatioToLowerBound`` — kubemoot's mean wait over the full trace's lower
  bound (secondary: the bound cannot charge the queueing placement rules impose);
* ``simSecondsFor100kCalls`` — wall seconds of the kubemoot run per call on fleet-16,
  times 100,000 (goal ≤ 60); ``simCpuSecondsFor100kCalls`` is the same in the process's
  CPU time, which drifts less when other jobs share the machine.

The baselines run exactly as :mod:`kubemoot.sim.policies` defines them; nothing here
tunes them. Run: ``.venv/bin/python bench/quality.py [--scenarios a,b] [--duration S]
[--plots DIR] [--no-optimum]`` (the optimum needs ``pip install -e '.[bench]'``);
``--seeds 1,2,3`` prints instead kubemoot's mean wait on each scenario for each seed
(one seed is one draw of the workload).
``--plots DIR`` writes, per scenario, the wait CDF of every policy and a per-card
timeline of loads, unloads and queues for kubemoot and the best baseline.
``--cut-calls`` prints, per cut, kubemoot's schedule beside the selected optimum's, call
by call (the calls whose waits differ by more than a second), with kubemoot's loads and
unloads: where the gap to the foresight the spec allows comes from.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rich.console import Console  # noqa: E402

from kubemoot.sim import (  # noqa: E402
    Scenario,
    SimulationResult,
    build_trace,
    load_scenario,
    simulate,
)
from kubemoot.sim.cut import Cut, cut_trace  # noqa: E402
from kubemoot.sim.optimum import Hint, Optimum, hints_from, solve  # noqa: E402
from kubemoot.sim.phases import WaitSource, compare_calls  # noqa: E402
from kubemoot.sim.report import (  # noqa: E402
    comparison_table,
    wait_sources_table,
    write_timeline,
    write_wait_cdf,
)
from kubemoot.sim.simulation import POLICY_NAMES, PolicyRun, run_policy  # noqa: E402

SCENARIOS = ROOT / "examples" / "scenarios"
DEFAULT_SCENARIOS = ("homelab", "fleet-16", "memory-tight", "burst-fanout", "long-discussion")
SPEED_SCENARIO = "fleet-16"
#: The cut each scenario's optimum is solved on: cards, models, calls.
CUT = {"cards": 3, "models": 4, "calls": 40}
#: The solver's deterministic time per cut (about seconds of one core's work).
OPTIMUM_TIME_LIMIT = 5.0


def _cut_calls(cut: Cut, ours: PolicyRun, selected: Optimum, console: Console) -> None:
    """Kubemoot's schedule on the cut beside the selected optimum's, call by call.

    Only the calls whose waits differ by more than a second are listed, then both
    totals (and per band), the optimum's copies by when their first call starts, and
    kubemoot's loads and unloads: what the optimum that loads nothing before a
    selection did differently, read against the trace.
    """
    placed = {p.call_id: p for p in selected.placed}
    ours_total = theirs_total = 0.0
    rows: list[str] = []
    bands: dict[str, list[float]] = {}  # band → [calls, kubemoot's waits, the optimum's]
    for call in cut.calls:
        served, best = ours.served.get(call.call_id), placed.get(call.call_id)
        if served is None or best is None:
            continue
        wait = served.started - served.issued
        ours_total += wait
        theirs_total += best.wait
        band = bands.setdefault("/".join(call.models), [0, 0.0, 0.0])
        band[0] += 1
        band[1] += wait
        band[2] += best.wait
        if abs(wait - best.wait) > 1.0:
            rows.append(
                f"  call {call.call_id:>2} selected {call.selected_at:6.1f} s, issued "
                f"{call.release:6.1f} s, runs {call.duration:5.1f} s, band "
                f"{'/'.join(call.models)}: kubemoot {served.card} {served.model} waits "
                f"{wait:5.1f} s; selected optimum {best.card} {best.model} waits "
                f"{best.wait:5.1f} s")
    console.print(
        f"{cut.name}, call by call against the selected optimum: total wait kubemoot "
        f"{ours_total:.1f} s, selected optimum {theirs_total:.1f} s; {len(rows)} calls "
        "differ by over 1 s; by band (calls, kubemoot's total wait, the selected "
        "optimum's): " + "; ".join(f"{b} {n:.0f}, {o:.1f} s, {t:.1f} s"
                                   for b, (n, o, t) in bands.items()),
        soft_wrap=True, highlight=False)
    for row in rows:
        console.print(row, soft_wrap=True, highlight=False)
    first_use: dict[tuple[str, str, int], float] = {}
    for p in sorted(selected.placed, key=lambda p: p.start):
        first_use.setdefault((p.card, p.model, p.load), p.start)
    console.print("  the selected optimum's copies, by their first call's start: " + "; ".join(
        f"{at:.1f} s {card} {model}" + (f" (load {load + 1})" if load else "")
        for (card, model, load), at in first_use.items()), soft_wrap=True, highlight=False)
    console.print("  kubemoot's loads: " + "; ".join(
        f"{at:.1f} s {card} {model}" for at, card, model, _mib in ours.loads)
        + (" — unloads: " + "; ".join(f"{at:.1f} s {card} {model} ({why})"
                                      for at, card, model, why in ours.unloads)
           if ours.unloads else ""), soft_wrap=True, highlight=False)


@dataclass(frozen=True)
class CutOptima:
    """A scenario's cut, every policy's run on it and its three optima (see below)."""

    cut: Cut
    runs: dict[str, PolicyRun]
    hint: dict[int, Hint]  # the best policy's schedule: where every search starts
    reactive: Optimum
    selected: Optimum
    optimum: Optimum


def cut_optima(scenario: Scenario, seed: int, seconds: float) -> CutOptima:
    """The scenario's cut with every policy run on it and its optima, found as the bench
    reports them (bench/spec_floor.py divides by the same figures)."""
    cut = cut_trace(scenario, build_trace(scenario, seed=seed), **CUT)
    assert cut.scenario is not None and cut.trace is not None
    runs = {p: run_policy(cut.scenario, cut.trace, p, seed=seed) for p in POLICY_NAMES}

    # The best policy's schedule is where each search starts: it only speeds the search.
    best = min(runs.values(), key=lambda r: r.report.wait["mean"])
    hint = hints_from({c: (s.card, s.model, s.started) for c, s in best.served.items()},
                      best.loads)
    # Without loading a model before a call asked for it (no online policy can): how
    # much of the gap is foresight rather than placement.
    reactive = solve(cut, time_limit_seconds=seconds, hint=hint, reactive=True)
    # ...with what the spec lets a runtime know: an agent's selection, before its first
    # call (a load may start at selection, never before).
    selected = solve(cut, time_limit_seconds=seconds, hint=hint, selected=True)
    # ...and knowing every call in advance. Each search keeps the stricter one's
    # schedule when its own time limit stopped it above that (Optimum.or_stricter), so
    # optimum ≤ selected ≤ reactive always holds.
    selected = selected.or_stricter(reactive)
    optimum = solve(cut, time_limit_seconds=seconds, hint=hint).or_stricter(selected)
    return CutOptima(cut, runs, hint, reactive, selected, optimum)


def _optimum(
    scenario: Scenario, result: SimulationResult, console: Console, seconds: float,
    *, calls: bool = False,
) -> dict[str, Any]:
    """Every policy on the scenario's cut, over the cut's offline optimum."""
    found = cut_optima(scenario, result.seed, seconds)
    cut, runs, reactive, selected, optimum = (
        found.cut, found.runs, found.reactive, found.selected, found.optimum)
    if calls:
        _cut_calls(cut, runs["kubemoot"], selected, console)
    ours = runs["kubemoot"].report.wait["mean"]
    ratios = {p: round(r.report.wait["mean"] / max(optimum.mean_wait, 1e-9), 3)
              for p, r in runs.items()}
    reactive_ratios = {p: round(r.report.wait["mean"] / max(reactive.mean_wait, 1e-9), 3)
                       for p, r in runs.items()}
    selected_ratios = {p: round(r.report.wait["mean"] / max(selected.mean_wait, 1e-9), 3)
                       for p, r in runs.items()}
    console.print(
        f"{scenario.name} cut ({len(cut.cards)} cards {', '.join(c.name for c in cut.cards)}; "
        f"{len(cut.sizes)} models; {optimum.calls} calls over "
        f"{cut.calls[-1].release:.0f} s): optimum {optimum.mean_wait:.2f} s "
        f"({'proven' if optimum.proven else f'not proven; bound {optimum.bound_mean_wait:.2f} s'}"
        f", solved in {optimum.solve_seconds:.0f} s); mean wait ÷ optimum: "
        + ", ".join(f"{p} {v:.2f}" for p, v in ratios.items())
        + f"; reactive optimum {reactive.mean_wait:.2f} s ("
        + ("proven" if reactive.proven else f"not proven; bound {reactive.bound_mean_wait:.2f} s")
        + "): " + ", ".join(f"{p} {v:.2f}" for p, v in reactive_ratios.items())
        + f"; selected optimum {selected.mean_wait:.2f} s ("
        + ("proven" if selected.proven else f"not proven; bound {selected.bound_mean_wait:.2f} s")
        + "): " + ", ".join(f"{p} {v:.2f}" for p, v in selected_ratios.items())
        + f"; kubemoot's {ours:.2f} s by source: "
        + ", ".join(f"{k} {v:.2f}" for k, v in runs["kubemoot"].report.wait_parts.items())
    )
    return {
        "optimum": optimum.to_json(),
        "cardsModelsCalls": [len(cut.cards), len(cut.sizes), optimum.calls],
        "kubemootMeanWaitSeconds": ours,
        "kubemootMeanWaitBySource": dict(runs["kubemoot"].report.wait_parts),
        "meanWaitRatioToOptimum": ratios["kubemoot"],
        "meanWaitRatioToOptimumBound": round(ours / max(optimum.bound_mean_wait, 1e-9), 3),
        "everyPolicyRatioToOptimum": ratios,
        "reactiveOptimum": reactive.to_json(),
        "meanWaitRatioToReactiveOptimum": reactive_ratios["kubemoot"],
        "everyPolicyRatioToReactiveOptimum": reactive_ratios,
        "selectedOptimum": selected.to_json(),
        "meanWaitRatioToSelectedOptimum": selected_ratios["kubemoot"],
        "everyPolicyRatioToSelectedOptimum": selected_ratios,
    }


def _one(
    name: str, duration: float | None, console: Console, *, plots: Path | None,
    optimum: float | None, keep_alive: float | None = None, cut_calls: bool = False,
) -> dict[str, Any]:
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    if duration is not None:
        scenario = scenario.with_duration(duration)
    if keep_alive is not None:
        spec = scenario.spec
        scenario = scenario.model_copy(update={"spec": spec.model_copy(update={
            "settings": spec.settings.model_copy(update={"keep_alive_seconds": keep_alive})})})
    result = simulate(scenario)
    console.print(comparison_table(result))
    console.print(wait_sources_table(result))
    runs = {run.report.policy: run for run in result.runs}
    ours = runs["kubemoot"].report
    baselines = {p: r.report for p, r in runs.items() if p != "kubemoot"}
    best = min(baselines.values(), key=lambda r: r.wait["mean"])
    versus = compare_calls(runs["kubemoot"].waits_by_call, runs["herd-like"].waits_by_call)
    sources = ", ".join(f"{k} {v:.0f} s" for k, v in versus.by_source.items() if v >= 0.5)
    console.print(
        f"{name}: {versus.worse} of {versus.calls} calls waited over 1 s longer under "
        f"kubemoot than under herd-like ({versus.extra_seconds:.0f} s extra in all; their "
        f"waits under kubemoot by source: {sources or 'none'})"
    )
    if plots is not None:
        write_wait_cdf(result, plots / f"{name}-wait-cdf.png")
        write_timeline(result, ("kubemoot", best.policy), plots / f"{name}-timeline.png")
    figures = {
        "meanWaitSeconds": ours.wait["mean"],
        "bestBaseline": best.policy,
        "bestBaselineMeanWaitSeconds": best.wait["mean"],
        "meanWaitRatioToBestBaseline": round(ours.wait["mean"] / max(best.wait["mean"], 1e-9), 3),
        "coldLoadRatioToRoundRobin": round(
            ours.cold_loads / max(baselines["round-robin"].cold_loads, 1), 3),
        "lowerBoundSeconds": round(result.bound.mean_wait, 3),
        "meanWaitRatioToLowerBound": round(ours.wait["mean"] / max(result.bound.mean_wait, 1e-9),
                                           3),
        "meanWaitBySource": {k: ours.wait_parts.get(k, 0.0) for k in WaitSource},
        "bestBaselineMeanWaitBySource": {k: best.wait_parts.get(k, 0.0) for k in WaitSource},
        "lostCalls": sum(ours.stood_aside.values()) + sum(ours.refused.values()) + ours.failures,
        "callsWorseThanHerdLike": versus.to_json(),
        "simSecondsPerCall": ours.wall_seconds / max(ours.calls, 1),
        "simCpuSecondsPerCall": ours.cpu_seconds / max(ours.calls, 1),
    }
    if optimum is not None:
        figures["cut"] = _optimum(scenario, result, console, optimum, calls=cut_calls)
        figures["meanWaitRatioToOptimum"] = figures["cut"]["meanWaitRatioToOptimum"]
        figures["meanWaitRatioToReactiveOptimum"] = figures["cut"][
            "meanWaitRatioToReactiveOptimum"]
        figures["meanWaitRatioToSelectedOptimum"] = figures["cut"][
            "meanWaitRatioToSelectedOptimum"]
    console.print(
        f"{name}: kubemoot mean wait {ours.wait['mean']:.2f} s, best baseline {best.policy} "
        f"{best.wait['mean']:.2f} s (ratio {figures['meanWaitRatioToBestBaseline']:.3f}); cold "
        f"loads {ours.cold_loads} vs round-robin {baselines['round-robin'].cold_loads} (ratio "
        f"{figures['coldLoadRatioToRoundRobin']:.3f}); lower bound "
        f"{result.bound.mean_wait:.3f} s (ratio {figures['meanWaitRatioToLowerBound']:.1f}); "
        f"lost {figures['lostCalls']}; kubemoot run {ours.wall_seconds:.2f} s for "
        f"{ours.calls} calls"
    )
    return figures


def _seeds(names: list[str], seeds: list[int], duration: float | None) -> None:
    """Kubemoot's mean wait per scenario and seed: one seed is one draw of the workload,
    so a change that helps on the bench's seed alone is checked over several."""
    per: dict[str, dict[str, Any]] = {}
    for name in names:
        scenario = load_scenario(SCENARIOS / f"{name}.yaml")
        if duration is not None:
            scenario = scenario.with_duration(duration)
        waits = [run_policy(scenario, build_trace(scenario, seed=seed), "kubemoot",
                            seed=seed).report.wait["mean"] for seed in seeds]
        per[name] = {"meanWaitSeconds": dict(zip(map(str, seeds), waits, strict=True)),
                     "meanOverSeeds": round(sum(waits) / len(waits), 4)}
        print(f"{name}: kubemoot mean wait over seeds {per[name]['meanOverSeeds']:.3f} s ("
              + ", ".join(f"{s}: {w:.3f}" for s, w in zip(seeds, waits, strict=True)) + ")")
    print(json.dumps({"seeds": seeds, "perScenario": per}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help="comma-separated scenario names from examples/scenarios")
    parser.add_argument("--duration", type=float, default=None,
                        help="shorten every scenario to this many seconds (smoke runs)")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="write each scenario's wait CDF and card timelines here")
    parser.add_argument("--no-optimum", action="store_true",
                        help="skip the offline optimum (it needs OR-Tools)")
    parser.add_argument("--keep-alive", type=float, default=None, metavar="SECONDS",
                        help="the engines' keep-alive for calls that send none (the "
                             "routers'; kubemoot asks for its own), instead of the file's")
    parser.add_argument("--optimum-seconds", type=float, default=OPTIMUM_TIME_LIMIT,
                        metavar="SECONDS",
                        help="the solver's deterministic time per cut (smoke runs: less)")
    parser.add_argument("--cut-calls", action="store_true",
                        help="print each cut's schedule beside the selected optimum's, "
                             "call by call")
    parser.add_argument("--seeds", default=None, metavar="S1,S2,...",
                        help="instead of the comparison: kubemoot's mean wait on each "
                             "scenario for each of these seeds, and their mean")
    args = parser.parse_args()
    if args.seeds is not None:
        _seeds([n for n in args.scenarios.split(",") if n],
               [int(s) for s in args.seeds.split(",") if s], args.duration)
        return
    console = Console(width=110)
    if args.plots is not None:
        args.plots.mkdir(parents=True, exist_ok=True)
    per: dict[str, dict[str, Any]] = {}
    for name in [n for n in args.scenarios.split(",") if n]:
        per[name] = _one(name, args.duration, console, plots=args.plots,
                         optimum=None if args.no_optimum else args.optimum_seconds,
                         keep_alive=args.keep_alive, cut_calls=args.cut_calls)
    speed = per.get(SPEED_SCENARIO) or next(iter(per.values()))
    to_optimum = [f["meanWaitRatioToOptimum"] for f in per.values()
                  if "meanWaitRatioToOptimum" in f]
    print(json.dumps({
        "meanWaitRatioToBestBaseline": max(f["meanWaitRatioToBestBaseline"] for f in per.values()),
        "meanWaitRatioToOptimum": max(to_optimum) if to_optimum else None,
        "meanWaitRatioToReactiveOptimum": max(
            (f["meanWaitRatioToReactiveOptimum"] for f in per.values()
             if "meanWaitRatioToReactiveOptimum" in f), default=None),
        "meanWaitRatioToSelectedOptimum": max(
            (f["meanWaitRatioToSelectedOptimum"] for f in per.values()
             if "meanWaitRatioToSelectedOptimum" in f), default=None),
        "coldLoadRatioToRoundRobin": max(f["coldLoadRatioToRoundRobin"] for f in per.values()),
        "meanWaitRatioToLowerBound": max(f["meanWaitRatioToLowerBound"] for f in per.values()),
        "simSecondsFor100kCalls": round(speed["simSecondsPerCall"] * 100_000, 1),
        "simCpuSecondsFor100kCalls": round(speed["simCpuSecondsPerCall"] * 100_000, 1),
        "perScenario": {
            name: {k: v for k, v in f.items() if not k.startswith("sim")}
            for name, f in per.items()
        },
    }))


if __name__ == "__main__":
    main()
