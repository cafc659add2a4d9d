"""The page is served with the fleet as it is now, so its first paint is not empty.

Without it the tables stayed empty until the event stream's first update; a browser
whose stream is refused (too many live pages) showed nothing at all.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import httpx

from kubemoot.clock import SystemClock
from kubemoot.dashboard.server import DashboardServer
from kubemoot.settings import DashboardSettings
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import wait_until
from tests.dashboard.conftest import Writers, state

HOSTILE = "evil</script><script>alert(1)</script><!--"
BLOCK = re.compile(r'<script id="first-state" type="application/json">(.*?)</script>', re.S)


async def _seen(server: DashboardServer, provider: str) -> None:
    await wait_until(lambda: any(p["provider"] == provider
                                 for p in server.view.snapshot()["providers"]),
                     timeout=30, what=f"the dashboard's view holding {provider}")


async def test_the_page_carries_the_current_snapshot_and_no_name_escapes_it(
    live_kv: MemoryKV,
) -> None:
    now = SystemClock().now()
    await Writers(live_kv).put_state(state("rtx5090", loaded={HOSTILE: 2048}, probed=now))
    async with DashboardServer(live_kv, port=0, clock=SystemClock()) as server:
        await _seen(server, "rtx5090")
        async with httpx.AsyncClient() as http:
            page = (await http.get(server.url)).text
    (block,) = BLOCK.findall(page)  # one block: the hostile name did not close it
    assert "</" not in block and "<" not in block
    snapshot = json.loads(block)
    (card,) = snapshot["providers"]
    assert card["provider"] == "rtx5090"
    assert HOSTILE in json.dumps(snapshot)  # read back unchanged
    assert "<script>alert(1)" not in page.replace(html.escape(HOSTILE), "")


async def test_a_page_whose_stream_is_refused_still_shows_the_fleet(
    browser: Any, live_kv: MemoryKV, artifacts: Path,
) -> None:
    now = SystemClock().now()
    await Writers(live_kv).put_state(state("rtx5090", loaded={"qwen3:32b": 27648}, probed=now))
    refused = DashboardSettings(max_clients=0)  # every event stream gets 503
    async with DashboardServer(live_kv, port=0, clock=SystemClock(),
                               settings=refused) as server:
        await _seen(server, "rtx5090")
        page = await browser.new_page()
        await page.goto(server.url)
        card = page.locator('.provider[data-provider="rtx5090"]')
        await card.wait_for()
        assert "qwen3:32b" in await card.inner_text()
        assert await page.evaluate("window.kubemootUpdates") == 0  # none from the stream
        await page.screenshot(path=str(artifacts / "first-paint.png"), full_page=True)
