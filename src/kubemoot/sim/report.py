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

from kubemoot.sim.simulation import SimulationResult

__all__ = ["comparison_table", "write_plots", "write_report"]


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
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in result.runs:
        waits = run.report.waits
        if waits:
            n = len(waits)
            ax.step(waits, [(i + 1) / n for i in range(n)], where="post",
                    label=run.report.policy)
    ax.set_xlabel("wait: issue → start of inference (s)")
    ax.set_ylabel("share of calls")
    ax.set_title(f"{result.scenario}: per-call wait CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, directory / "wait-cdf.png", plt))

    fig, axes = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for run in result.runs:
        load_times = sorted(t for t, *_ in run.loads)
        evict_times = sorted(t for t, _g, _m, why in run.unloads if why != "expired")
        axes[0].step(load_times, range(1, len(load_times) + 1), where="post",
                     label=run.report.policy)
        axes[1].step(evict_times, range(1, len(evict_times) + 1), where="post",
                     label=run.report.policy)
    axes[0].set_ylabel("cold loads (cumulative)")
    axes[1].set_ylabel("evictions (cumulative)")
    axes[1].set_xlabel("virtual time (s)")
    axes[0].set_title(f"{result.scenario}: loads and evictions over time")
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize="small")
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
        ax.set_title(f"{result.scenario}: VRAM per provider, policy {run.report.policy}")
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
