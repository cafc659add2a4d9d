"""``kubemoot gateway --dashboard``: the dashboard's page over the gateway's own store.

On the embedded store a homelab runs one process and no NATS, so nothing else could
read its state: the gateway serves the page itself. Same page, same browser checks as
tests/dashboard: the provider card, and the call that ran through the gateway.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ollama
import pytest

from tests.dashboard.conftest import artifacts, browser  # noqa: F401 (fixtures)
from tests.dashboard.test_dashboard_browser import READ_CALLS, until
from tests.gateway.conftest import OllamaEmulator  # the emulator, wherever it lives

pytestmark = pytest.mark.browser

KUBEMOOT = Path(sys.executable).with_name("kubemoot")


async def _announced(stream: asyncio.StreamReader, *prefixes: str) -> dict[str, str]:
    """The URLs the gateway prints on stderr (``gateway: URL …``, ``dashboard: URL``)."""
    found: dict[str, str] = {}
    seen = []
    while len(found) < len(prefixes):
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError(f"the gateway ended before announcing {prefixes}: {seen}")
        seen.append(line)
        for prefix in prefixes:
            if line.startswith(f"{prefix}: "):
                found[prefix] = line.split()[1]
    return found


@pytest.mark.timeout(120)
async def test_the_gateway_serves_the_dashboard_of_its_embedded_store(
        browser: Any, artifacts: Path,  # noqa: F811
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator()
    page = await browser.new_page()
    gateway = await asyncio.create_subprocess_exec(
        str(KUBEMOOT), "gateway", "--provider", f"gpu-a={emulator.url},vramMiB=8192,"
        "numParallel=2,contextLength=1024,reserveMiB=512", "--listen", "127.0.0.1:0",
        "--dashboard", "--dashboard-listen", "127.0.0.1:0",
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "300"})
    assert gateway.stderr is not None
    try:
        async with asyncio.timeout(90):
            urls = await _announced(gateway.stderr, "gateway", "dashboard")
            await page.goto(urls["dashboard"])
            await until(page, "window.kubemootUpdates >= 1")
            await page.wait_for_selector('.provider[data-provider="gpu-a"]')
            client = ollama.AsyncClient(host=urls["gateway"])
            reply = await client.chat(model="small:1b",
                                      messages=[{"role": "user", "content": "hello"}])
            assert reply.done
            # the call the gateway placed shows where it ran, without a reload
            await page.wait_for_selector('#agents [data-testid="call"][data-provider="gpu-a"]')
            [shown] = await page.evaluate(READ_CALLS)
            assert (shown["provider"], shown["model"]) == ("gpu-a", "small:1b")
            card = await page.locator('.provider[data-provider="gpu-a"]').inner_text()
            assert "small:1b" in card
            await page.screenshot(path=str(artifacts / "gateway.png"), full_page=True)
    finally:
        if gateway.returncode is None:
            gateway.terminate()
        await gateway.wait()
