"""The PNG plots a person reads: nothing drawn on top of anything else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubemoot.sim import report
from kubemoot.sim.scenario import load_scenario
from kubemoot.sim.simulation import simulate


def test_side_by_side_timelines_leave_room_for_their_tick_labels(
    scenarios: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The panels share one time axis, so the left panel's last tick label can sit on its
    # right edge while the right panel's "0" sits on its left edge; with too narrow a gap
    # they read as one number ("3500 0" as "35000"). Whether a label lands on the edge
    # depends on when the run ended, so the check is on the gap itself: at least as wide
    # as the widest tick label, half of which may stick out on each side.
    plt = report._pyplot()
    kept: list[Any] = []
    monkeypatch.setattr(plt, "close", kept.append)
    result = simulate(load_scenario(scenarios / "tiny.yaml"), policies=["kubemoot", "herd-like"])
    report.write_timeline(result, ["kubemoot", "herd-like"], tmp_path / "timeline.png")
    (fig,) = kept
    try:
        renderer = fig.canvas.get_renderer()
        left, right = fig.axes[0], fig.axes[1]
        gap = (right.get_window_extent(renderer).x0
               - left.get_window_extent(renderer).x1)
        widest = max(label.get_window_extent(renderer).width
                     for ax in (left, right) for label in ax.get_xticklabels()
                     if label.get_visible() and label.get_text())
        assert gap >= widest, (gap, widest)
    finally:
        monkeypatch.undo()
        plt.close(fig)
