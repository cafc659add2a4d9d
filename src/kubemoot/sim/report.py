"""Writing a simulation's results: report.json, PNG plots and the comparison table.

Plots use matplotlib's Agg backend (files only, no display); matplotlib is imported
inside :func:`write_plots` so importing the simulator stays quick.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from kubemoot.sim.phases import WaitSource
from kubemoot.sim.simulation import SimulationResult

__all__ = ["comparison_table", "wait_sources_table", "write_plots", "write_report"]

WAIT_FLOOR_SECONDS = 0.01  # the wait CDF's left edge (log axis)
LINE_STYLES = ("-", "--", "-.", ":")


def write_report(result: SimulationResult, directory: Path) -> Path:
    """``report.json`` (deterministic for a given scenario and seed: no wall times)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "report.json"
    path.write_text(json.dumps(result.to_json(), indent=2, sort_keys=False) + "\n",
                    encoding="utf-8")
    return path


def comparison_table(result: SimulationResult) -> Table:
    table = Table(title=f"{result.scenario}: {result.trace_calls} calls, "
                        f"{result.discussions} discussions, seed {result.seed}",
                  box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    # Short headers so the table fits an 80-column terminal; the caption explains them.
    table.add_column("policy", no_wrap=True, min_width=11)
    for column in ("wait", "p50", "p95", "p99", "span", "loads", "evict", "GiB",
                   "busy%", "lost", "÷LB"):
        table.add_column(column, justify="right", no_wrap=True, min_width=len(column))
    for run in result.runs:
        r = run.report
        lost = sum(r.stood_aside.values()) + sum(r.refused.values()) + r.failures
        table.add_row(
            r.policy, f"{r.wait['mean']:.1f}", f"{r.wait['p50']:.0f}", f"{r.wait['p95']:.0f}",
            f"{r.wait['p99']:.0f}", f"{r.makespan['mean']:.0f}",
            str(r.cold_loads), str(r.evictions), f"{r.gib_loaded:.0f}",
            f"{r.gpu_busy_percent:.0f}", str(lost),
            _ratio(r.ratio_to_lower_bound),
        )
    table.caption = (
        "wait: issue → start of inference (mean, percentiles); "
        "span: mean discussion makespan; loads: cold loads; evict: evictions; lost: stood "
        "aside, refused or failed; ÷LB: mean wait over the lower bound "
        f"({result.bound.mean_wait:.2f} s, see docs/simulator.md). Times in seconds."
    )
    return table


def wait_sources_table(result: SimulationResult) -> Table:
    """Each policy's mean wait split by where it went (see :mod:`kubemoot.sim.phases`)."""
    table = Table(title=f"{result.scenario}: where the mean wait goes (seconds per call)",
                  box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column("policy", no_wrap=True, min_width=11)
    for column in ("wait", *WaitSource):
        table.add_column(column, justify="right", no_wrap=True)
    for run in result.runs:
        r = run.report
        table.add_row(r.policy, f"{r.wait['mean']:.2f}",
                      *(f"{r.wait_parts.get(name, 0.0):.2f}" for name in WaitSource))
    table.caption = ("slot: waiting for a parallel slot of a loaded copy; load: its model "
                     "loading (or another load on the card); eviction: models being unloaded; "
                     "memory: waiting for room with nothing loading or unloading.")
    return table


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def write_plots(result: SimulationResult, directory: Path) -> list[Path]:
    """wait-cdf.png, loads-evictions.png, and vram-<policy>.png for each policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig: Any
    ax: Any
    fig, ax = plt.subplots(figsize=(9, 5.5))
    # A log time axis: the good policies differ below a few seconds while the worst
    # routers' tails run to minutes. Waits shorter than the floor are drawn at it.
    floor = WAIT_FLOOR_SECONDS
    longest = floor * 10
    for index, run in enumerate(result.runs):
        waits = run.report.waits
        if not waits:
            continue
        n = len(waits)
        xs = [max(w, floor) for w in waits]
        longest = max(longest, xs[-1])
        ax.step(xs, [(i + 1) / n for i in range(n)], where="post",
                label=f"{run.report.policy} (mean {run.report.wait['mean']:.1f} s)",
                linewidth=2.6 if run.report.policy == "kubemoot" else 1.4,
                linestyle=LINE_STYLES[index % len(LINE_STYLES)],
                zorder=3 if run.report.policy == "kubemoot" else 2)
    ax.set_xscale("log")
    ax.set_xlim(floor, longest * 1.5)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel(f"wait: issue → start of inference, seconds (log scale; "
                  f"waits under {floor:g} s drawn at {floor:g} s)")
    ax.set_ylabel("share of calls that waited at most this long")
    ax.set_title(f"Scenario {result.scenario}: per-call wait CDF "
                 f"({result.trace_calls} calls, higher and further left is better)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", loc="lower right")
    written.append(_save(fig, directory / "wait-cdf.png", plt))

    fig, ax = plt.subplots(figsize=(9, 5))
    names = [run.report.policy for run in result.runs]
    loads = [run.report.cold_loads for run in result.runs]
    evictions = [run.report.evictions for run in result.runs]
    positions = list(range(len(names)))
    width = 0.38
    bars = ax.bar([p - width / 2 for p in positions], loads, width, label="cold loads")
    ax.bar_label(bars, fontsize="small")
    bars = ax.bar([p + width / 2 for p in positions], evictions, width,
                  label="evictions (unloads to make room)")
    ax.bar_label(bars, fontsize="small")
    ax.set_xticks(positions, names)
    ax.set_ylabel("count over the whole run")
    ax.set_title(f"Scenario {result.scenario}: model loads and evictions per policy "
                 f"(fewer is better)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    written.append(_save(fig, directory / "loads-evictions.png", plt))

    for run in result.runs:
        fig, ax = plt.subplots(figsize=(8, 5))
        times = [t for t, _ in run.vram_samples]
        for provider, capacity in run.capacity_mib.items():
            used = [sample.get(provider, 0) / 1024 for _, sample in run.vram_samples]
            line = ax.plot(times, used, label=provider)
            ax.axhline(capacity / 1024, color=line[0].get_color(), linestyle=":", alpha=0.5)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("VRAM in use (GiB); dotted: usable")
        ax.set_title(f"Scenario {result.scenario}: VRAM in use per provider (GiB), "
                     f"policy {run.report.policy}")
        ax.grid(alpha=0.3)
        if len(run.capacity_mib) <= 16:
            ax.legend(fontsize="small", ncol=2)
        written.append(_save(fig, directory / f"vram-{run.report.policy}.png", plt))
    return written


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
