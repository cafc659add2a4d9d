"""The PNG plots a person reads: nothing drawn on top of anything else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubemoot.sim import report
from kubemoot.sim.scenario import load_scenario
from kubemoot.sim.simulation import simulate


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The figures the report writes, kept open (its ``close`` is held back) so a test
    can measure what was drawn; closed for real afterwards."""
    plt = report._pyplot()
    kept: list[Any] = []
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    monkeypatch.undo()
    for figure in kept:
        plt.close(figure)


def test_side_by_side_timelines_leave_room_for_their_tick_labels(
    scenarios: Path, tmp_path: Path, drawn: list[Any]
) -> None:
    # The panels share one time axis, so the left panel's last tick label can sit on its
    # right edge while the right panel's "0" sits on its left edge; with too narrow a gap
    # they read as one number ("3500 0" as "35000"). Whether a label lands on the edge
    # depends on when the run ended, so the check is on the gap itself: at least as wide
    # as the widest tick label, half of which may stick out on each side.
    result = simulate(load_scenario(scenarios / "tiny.yaml"), policies=["kubemoot", "herd-like"])
    report.write_timeline(result, ["kubemoot", "herd-like"], tmp_path / "timeline.png")
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    left, right = fig.axes[0], fig.axes[1]
    gap = (right.get_window_extent(renderer).x0
           - left.get_window_extent(renderer).x1)
    widest = max(label.get_window_extent(renderer).width
                 for ax in (left, right) for label in ax.get_xticklabels()
                 if label.get_visible() and label.get_text())
    assert gap >= widest, (gap, widest)


def test_vram_plot_of_a_busy_fleet_keeps_its_legend_off_the_data_and_its_cards_apart(
    scenarios: Path, tmp_path: Path, drawn: list[Any]
) -> None:
    # fleet-16 has sixteen cards: with ten colours and the legend on the axes, two cards
    # shared each colour and the legend hid the top of the busiest lines.
    scenario = load_scenario(scenarios / "fleet-16.yaml").with_duration(300)
    report.write_plots(simulate(scenario, policies=["round-robin"]), tmp_path)
    figures = {fig.axes[0].get_title(): fig for fig in drawn}
    (fig,) = [f for title, f in figures.items() if "VRAM in use" in title]
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    cards = [line for line in ax.get_lines() if line.get_label() != "_nolegend_"
             and not line.get_label().startswith("_")]
    assert len(cards) == 16
    looks = {(str(line.get_color()), line.get_linestyle()) for line in cards}
    assert len(looks) == len(cards)
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(ax.get_window_extent(renderer))
    assert legend.x1 <= fig.bbox.x1  # not cut off at the edge of the image
