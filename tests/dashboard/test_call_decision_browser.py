"""A call's decision on the page: click its chip, see its options and failed gates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubemoot.dashboard.server import DashboardServer
from kubemoot.store.memory import MemoryKV
from tests.dashboard.conftest import Writers, call
from tests.dashboard.test_dashboard_browser import until

DECISION = {
    "action": "unload", "chosen": "rtx5090/qwen3:32b", "outcome": "PLACE",
    "reason": "cheapest option", "victims": ["qwen3:8b"],
    "options": [
        {"kind": "unload", "provider": "rtx5090", "model": "qwen3:32b", "seconds": 13.0,
         "victims": ["qwen3:8b"]},
        {"kind": "queue", "provider": "rtx4090", "model": "qwen3:14b", "seconds": 95.0,
         "victims": []},
    ],
    "failedGates": [{"candidate": "rtx4090/qwen3:32b", "gate": "vram",
                     "reason": "model is larger than the provider's usable VRAM"}],
    "leftOut": {"options": 3},
}


async def test_clicking_a_call_shows_its_options_and_failed_gates(
    browser: Any, server: DashboardServer, live_kv: MemoryKV, artifacts: Path
) -> None:
    writers = Writers(live_kv)
    page = await browser.new_page()
    await page.goto(server.url)
    decided = call("crew/analyst", 1, provider="rtx5090", model="qwen3:32b",
                   evicted=("qwen3:8b",)).model_copy(update={"decision": DECISION,
                                                              "action": "unload"})
    await writers.put_call(decided)
    await writers.put_call(call("crew/tooler", 2, provider="rtx4090"))  # no decision
    chip = '#agents [data-testid="call"][data-agent="crew/analyst"]'
    await page.wait_for_selector(chip)
    assert await page.locator("#call-detail").is_hidden()

    await page.click(chip)
    await until(page, "!document.getElementById('call-detail').hidden")
    rows = await page.locator('[data-testid="decision-options"] tbody tr').all_inner_texts()
    gates = await page.locator('[data-testid="decision-gates"] li').all_inner_texts()
    detail = await page.locator("#call-detail").inner_text()
    await page.screenshot(path=str(artifacts / "decision.png"), full_page=True)
    # the panel stays open across the page's redraws (it is redrawn every second)
    updates = await page.evaluate("window.kubemootUpdates")
    await writers.put_call(call("crew/tooler", 3, provider="rtx4090"))
    await until(page, f"window.kubemootUpdates > {updates}")
    still_open = not await page.locator("#call-detail").is_hidden()

    await page.click('#agents [data-testid="call"][data-agent="crew/tooler"] >> nth=0')
    await until(page, "document.getElementById('call-detail').innerText.includes('crew/tooler')")
    plain = await page.locator("#call-detail").inner_text()

    assert [r.split("\t") for r in rows] == [
        ["unload", "rtx5090", "qwen3:32b", "13.00", "qwen3:8b"],
        ["queue", "rtx4090", "qwen3:14b", "95.00", "—"]]
    assert gates == ["rtx4090/qwen3:32b: vram — model is larger than the provider's usable VRAM"]
    assert "chosen rtx5090/qwen3:32b" in detail and "victims qwen3:8b" in detail
    assert "not shown: 3 more options" in detail
    assert still_open
    assert "no decision record" in plain
