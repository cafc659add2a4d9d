"""The provider bar never shows a segment's label cut.

A narrow segment used to clip its label: a new user read "re" for the reserve and "2.0"
for a free figure. A label that does not fit is now left out; the segment's title and the
facts line under the bar still carry its figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubemoot.clock import SystemClock
from kubemoot.dashboard.server import DashboardServer
from kubemoot.store.memory import MemoryKV
from tests.dashboard.conftest import Writers, state

# Each segment of each bar as the page lays it out.
READ_SEGMENTS = """() => [...document.querySelectorAll('[data-testid="vram-bar"] span')].map(s => ({
    provider: s.closest('.provider').dataset.provider, kind: s.className,
    text: s.textContent, title: s.title, scroll: s.scrollWidth, client: s.clientWidth }))"""


async def test_no_segment_label_is_shown_cut(
    browser: Any, server: DashboardServer, live_kv: MemoryKV, artifacts: Path,
) -> None:
    now = SystemClock().now()
    # 32 GiB: a big model, a small one, the default reserve and about 3 GiB free — all
    # but the big model's segment are too narrow for their labels on a card this wide.
    await Writers(live_kv).put_state(state(
        "rtx5090", loaded={"qwen3:32b": 27648, "qwen3:0.6b": 700}, probed=now))
    page = await browser.new_page()
    await page.goto(server.url)
    await page.wait_for_selector('.provider[data-provider="rtx5090"] [data-testid="vram-bar"]')
    segments = await page.evaluate(READ_SEGMENTS)

    cut = [s for s in segments if s["text"] and s["scroll"] > s["client"]]
    assert not cut, f"labels shown cut: {cut}"
    kinds = {s["kind"].split()[0] for s in segments}
    assert {"resident", "reserve", "free"} <= kinds
    shown = {s["text"] for s in segments if s["text"]}
    assert "qwen3:32b" in shown  # a label that fits stays
    assert any(not s["text"] for s in segments)  # the scene does have narrow segments
    for s in segments:  # every segment still names its figure on hover, once
        assert s["title"].endswith(" GiB"), s
        assert s["title"].count("GiB") == 1, s
    titles = {s["kind"].split()[0]: s["title"] for s in segments}
    assert titles["free"] == "free: 3.3 GiB" and titles["reserve"] == "reserve: 1.0 GiB"
    facts = await page.locator('.provider[data-provider="rtx5090"] .facts').inner_text()
    assert "1.0 GiB reserve" in facts and "3.3 GiB free of 32.0 GiB" in facts
    await page.screenshot(path=str(artifacts / "bar-labels.png"), full_page=True)
