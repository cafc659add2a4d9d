"""Writing a simulation's results: report.json, PNG plots and the comparison table.

Plots use matplotlib's Agg backend (files only, no display); matplotlib is imported
inside :func:`write_plots` so importing the simulator stays quick.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from kubemoot.sim.phases import WaitSource
from kubemoot.sim.simulation import PolicyRun, SimulationResult

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
        "wait: issue → first token, prefill included (mean, percentiles); "
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
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    written = [write_wait_cdf(result, directory / "wait-cdf.png")]

    fig: Any
    ax: Any
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
        fig, ax = plt.subplots(figsize=(9, 5))
        times = [t for t, _ in run.vram_samples]
        palette = plt.get_cmap("tab10")
        for i, (provider, capacity) in enumerate(run.capacity_mib.items()):
            used = [sample.get(provider, 0) / 1024 for _, sample in run.vram_samples]
            # Ten colours, then the same ten dashed: past ten cards a colour alone would
            # name two of them. Dotted stays for the usable-memory lines.
            line = ax.plot(times, used, label=provider, color=palette(i % 10),
                           linestyle=LINE_STYLES[(i // 10) % 3])
            ax.axhline(capacity / 1024, color=line[0].get_color(), linestyle=":", alpha=0.5)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("VRAM in use (GiB); dotted: usable")
        ax.set_title(f"Scenario {result.scenario}: VRAM in use per provider (GiB), "
                     f"policy {run.report.policy}")
        ax.grid(alpha=0.3)
        if len(run.capacity_mib) <= 16:
            # Beside the axes, not on them: on a busy fleet every corner holds data.
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1),
                      borderaxespad=0)
        written.append(_save(fig, directory / f"vram-{run.report.policy}.png", plt))
    return written


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_wait_cdf(result: SimulationResult, path: Path) -> Path:
    """Every policy's per-call wait CDF on a log time axis, as one PNG."""
    plt = _pyplot()
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
    ax.set_xlabel(f"wait: issue → first token, seconds (log scale; "
                  f"waits under {floor:g} s drawn at {floor:g} s)")
    ax.set_ylabel("share of calls that waited at most this long")
    ax.set_title(f"Scenario {result.scenario}: per-call wait CDF "
                 f"({result.trace_calls} calls, higher and further left is better)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", loc="lower right")
    return _save(fig, path, plt)


def _residencies(run: PolicyRun) -> list[tuple[str, str, float, float, str]]:
    """(card, model, loaded at, gone at, why) for every copy the run loaded."""
    out: list[tuple[str, str, float, float, str]] = []
    unloads = sorted(run.unloads)
    for at, card, model, _mib in sorted(run.loads):
        gone = next(((t, why) for t, c, m, why in unloads
                     if c == card and m == model and t >= at), (run.end, "end"))
        out.append((card, model, at, gone[0], gone[1]))
    return out


def _lanes(
    copies: list[tuple[str, str, float, float, str]],
) -> dict[str, list[tuple[int, str, float, float, str]]]:
    """Per card, each copy with a lane: the lowest not taken by a copy still resident."""
    out: dict[str, list[tuple[int, str, float, float, str]]] = {}
    for card, model, start, end, why in sorted(copies, key=lambda c: (c[0], c[2])):
        placed = out.setdefault(card, [])
        busy = {lane for lane, _m, s, e, _w in placed if s <= start < e}
        lane = next(i for i in range(len(placed) + 1) if i not in busy)
        placed.append((lane, model, start, end, why))
    return out


def _queue_steps(run: PolicyRun, card: str) -> tuple[list[float], list[int]]:
    """Calls waiting for ``card`` over time (issued, not started, and served there)."""
    changes: list[tuple[float, int]] = []
    for served in run.served.values():
        if served.card == card and served.started > served.issued:
            changes += [(served.issued, 1), (served.started, -1)]
    times, depth, level = [0.0], [0], 0
    for at, step in sorted(changes):
        level += step
        times.append(at)
        depth.append(level)
    times.append(run.end)
    depth.append(level)
    return times, depth


def write_timeline(result: SimulationResult, policies: Sequence[str], path: Path) -> Path:
    """Per card, side by side for ``policies``: which model was resident when (a bar per
    copy, from the start of its load), its unloads (a cross: red when pushed out to make
    room, grey when its keep-alive ran out), and the calls queued for the card (a line
    inside the card's band, scaled to the deepest queue of the figure)."""
    plt = _pyplot()
    runs = {run.report.policy: run for run in result.runs}
    chosen = [runs[p] for p in policies if p in runs]
    cards = sorted({card for run in chosen for card in run.usable_mib})
    models = sorted({m for run in chosen for _t, _c, m, _mib in run.loads})
    palette = plt.get_cmap("tab20")
    colour = {m: palette(i % 20) for i, m in enumerate(models)}
    deepest = max([1] + [max(_queue_steps(run, c)[1]) for run in chosen for c in cards])
    legend_rows = -(-(len(models) + 3) // 5)
    legend_inches = 0.25 * legend_rows + 0.1  # the legend under the axis labels
    height = 1.2 + 0.45 * max(len(cards), 4) + legend_inches
    last = max(run.end for run in chosen)
    fig: Any
    fig, axes = plt.subplots(1, len(chosen), figsize=(7 * len(chosen), height),
                             sharey=True, squeeze=False)
    for ax, run in zip(axes[0], chosen, strict=True):
        row = {card: i for i, card in enumerate(cards)}
        for card, copies in _lanes(_residencies(run)).items():
            lanes = 1 + max(lane for lane, *_rest in copies)
            band = 0.7 / lanes  # copies resident together share the card's band
            for lane, model, start, end, why in copies:
                bottom = row[card] - 0.35 + lane * band
                ax.broken_barh([(start, max(end - start, 0.5))], (bottom, band * 0.9),
                               facecolors=colour[model])
                middle = bottom + band * 0.45
                if why in ("evicted", "unloaded", "reload"):
                    ax.plot(end, middle, "x", color="red", markersize=7, markeredgewidth=2)
                elif why == "expired":
                    ax.plot(end, middle, "x", color="dimgrey", markersize=6)
        for card in cards:
            times, depth = _queue_steps(run, card)
            base = row[card] - 0.45
            ax.fill_between(times, base, [base + 0.9 * d / deepest for d in depth],
                            step="post", color="black", alpha=0.45, linewidth=0)
        ax.set_yticks(range(len(cards)), cards)
        ax.set_ylim(-0.6, len(cards) - 0.4)
        ax.set_xlim(0, last)  # one time axis for both, so their spans compare
        ax.set_xlabel("virtual time (s)")
        ax.set_title(f"{run.report.policy}: {run.report.cold_loads} loads, "
                     f"{run.report.evictions} evictions, mean wait "
                     f"{run.report.wait['mean']:.2f} s", fontsize="medium")
        ax.grid(alpha=0.3, axis="x")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[m], alpha=0.75) for m in models]
    handles += [plt.Line2D([], [], color="red", marker="x", linestyle=""),
                plt.Line2D([], [], color="dimgrey", marker="x", linestyle=""),
                plt.Rectangle((0, 0), 1, 1, color="black", alpha=0.45)]
    labels = [*models, "unloaded to make room", "keep-alive ran out",
              f"calls queued for the card (band height = {deepest})"]
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5),
               fontsize="small", frameon=False)
    fig.suptitle(f"Scenario {result.scenario}: resident models, unloads and queues per card")
    # wspace 0.1 is about 0.6 in between panels: room for half of a six-digit tick
    # label on each side, so the left panel's last time and the right one's 0 stay apart.
    fig.subplots_adjust(left=0.07, right=0.99, wspace=0.1, top=1 - 0.75 / height,
                        bottom=(legend_inches + 0.55) / height)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
