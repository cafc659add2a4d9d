"""The page in headless Chromium: live updates, and per-call attribution from the demo."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubemoot.clock import SystemClock
from kubemoot.dashboard.server import DashboardServer
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import wait_until
from tests.dashboard.conftest import Writers, call, state

KUBEMOOT = Path(sys.executable).with_name("kubemoot")

# What the page shows of each call in the Agent Summary's GPU column.
READ_CALLS = """() => [...document.querySelectorAll('#agents [data-testid="call"]')].map(c => ({
    agent: c.dataset.agent, provider: c.dataset.provider, model: c.dataset.model,
    phase: c.dataset.phase, evicted: c.dataset.evicted }))"""
READ_TOTALS = """() => Object.fromEntries(
    [...document.querySelectorAll('#agents tr[data-agent]')].map(r => [r.dataset.agent,
        Number(r.querySelector('[data-testid="agent-calls"]').textContent)]))"""


async def until(page: Any, expression: str) -> None:
    """Wait until ``expression`` holds in the page.

    The browser is a process of its own and tells this one nothing, so this asks again.
    Not ``page.wait_for_function``: it evaluates its predicate from a string inside the
    page, which the dashboard's content security policy rightly forbids; an evaluation
    driven from outside (``page.evaluate``) is not subject to it.
    """
    await wait_until(lambda: page.evaluate(expression), timeout=60,
                     what=f"the page's {expression}")


async def test_dashboard_page_updates_without_reload(
    browser: Any, server: DashboardServer, live_kv: MemoryKV, artifacts: Path
) -> None:
    writers = Writers(live_kv)
    page = await browser.new_page()
    await page.goto(server.url)
    await until(page, "window.kubemootUpdates >= 1")
    assert await page.locator("#connection").get_attribute("data-state") == "live"
    assert "No provider has been probed yet." in await page.locator("#providers").inner_text()
    await page.evaluate("window.loadedOnce = 'still here'")  # a reload would drop it

    now = SystemClock().now()
    await writers.put_state(state("rtx5090", loaded={"qwen3:32b": 27648}, probed=now))
    await writers.put_state(state("rtx4090", total=24576, loaded={"qwen3:14b": 12288},
                                  probed=now - 600))
    await writers.put_call(call("crew/analyst", 1, provider="rtx5090", model="qwen3:32b",
                                evicted=("qwen3:8b",)))
    await page.wait_for_selector('#agents [data-testid="call"][data-provider="rtx5090"]')
    await page.wait_for_selector('.provider[data-provider="rtx4090"][data-status="stale"]')

    assert await page.evaluate("window.loadedOnce") == "still here"
    assert await page.evaluate("window.kubemootUpdates") >= 2
    [shown] = await page.evaluate(READ_CALLS)
    assert shown == {"agent": "crew/analyst", "provider": "rtx5090", "model": "qwen3:32b",
                     "phase": "mulling", "evicted": "qwen3:8b"}
    card = await page.locator('.provider[data-provider="rtx5090"]').inner_text()
    assert "ready" in card and "qwen3:32b" in card
    await page.screenshot(path=str(artifacts / "live.png"), full_page=True)


async def _read_json(stream: asyncio.StreamReader) -> dict[str, Any]:
    """The demo's one JSON object; it arrives while the dashboard keeps serving."""
    text = ""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            raise AssertionError(f"the demo ended its output without a JSON object: {text!r}")
        text += chunk.decode()
        try:
            parsed: dict[str, Any] = json.loads(text)
            return parsed
        except json.JSONDecodeError:
            continue


async def _dashboard_url(stream: asyncio.StreamReader) -> str:
    seen = []
    while line := (await stream.readline()).decode():
        seen.append(line)
        if line.startswith("dashboard: "):
            return line.split()[1]
    raise AssertionError(f"the demo never announced its dashboard: {''.join(seen)}")


@pytest.mark.timeout(120)
async def test_dashboard_shows_where_demo_calls_ran(browser: Any, artifacts: Path) -> None:
    """Against a running ``kubemoot demo --dashboard``: the GPU column names the provider
    each call really ran on, cross-checked with the demo's JSON, and updates live."""
    page = await browser.new_page()  # Chromium is up before the demo starts
    demo = await asyncio.create_subprocess_exec(
        str(KUBEMOOT), "demo", "--dashboard", "--dashboard-port", "0",
        "--dashboard-linger", "60", "-o", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
    )
    assert demo.stdout is not None and demo.stderr is not None
    try:
        async with asyncio.timeout(90):
            url = await _dashboard_url(demo.stderr)
            await page.goto(url)
            await until(page, "window.kubemootUpdates >= 1")
            first_total = sum((await page.evaluate(READ_TOTALS)).values())
            await page.evaluate("window.loadedOnce = 'still here'")
            report = await _read_json(demo.stdout)
            calls = report["calls"]
            expected_total = len(calls)
            await until(page, f"""[...document.querySelectorAll('[data-testid="agent-calls"]')]
                .reduce((n, td) => n + Number(td.textContent), 0) === {expected_total}""")
            shown = await page.evaluate(READ_CALLS)
            totals = await page.evaluate(READ_TOTALS)
            async with httpx.AsyncClient(base_url=url) as client:
                scraped = (await client.get("/metrics")).text
            await page.screenshot(path=str(artifacts / "demo.png"), full_page=True)
    finally:
        if demo.returncode is None:
            demo.terminate()
        await demo.wait()

    # Updated in place: the page saw fewer calls at first, and was never reloaded.
    assert first_total < expected_total
    assert await page.evaluate("window.loadedOnce") == "still here"

    by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in calls:
        by_agent[c["agent"]].append(c)
    assert totals == {agent: len(cs) for agent, cs in by_agent.items()}
    assert {c["provider"] for c in calls} >= {"rtx5090"}  # the demo used the big card
    # Each agent's chips, newest first, are its most recent calls in the demo's JSON.
    shown_by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for chip in shown:
        shown_by_agent[chip["agent"]].append(chip)
    for agent, chips in shown_by_agent.items():
        newest = list(reversed(by_agent[agent]))[: len(chips)]
        assert [(c["provider"], c["model"], c["phase"], c["evicted"]) for c in chips] == [
            (c["provider"], c["model"], c["phase"], ",".join(c["evicted"])) for c in newest
        ], agent

    # The demo's process exposes the runtime's metrics beside the fleet's.
    values: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(scraped):
        for s in family.samples:
            values[s.name] += s.value
    assert values["kubemoot_placement_decisions_total"] >= expected_total
    assert values["kubemoot_ticket_claims_total"] >= expected_total
    assert values["kubemoot_placement_seconds_count"] >= expected_total
    assert values["kubemoot_evictions_total"] == report["evictions"]


@pytest.mark.nats
async def test_the_page_says_when_the_store_is_lost_and_when_it_is_back(
    browser: Any, artifacts: Path
) -> None:
    from kubemoot.settings import DashboardSettings, NatsSettings
    from kubemoot.store.nats import NatsKV
    from kubemoot.testing.nats_server import running_nats_server

    async with running_nats_server() as server:
        kv = await NatsKV.connect(NatsSettings(servers=[server.url]))
        try:
            settings = DashboardSettings(store_check_seconds=0.5)
            async with DashboardServer(kv, port=0, clock=SystemClock(),
                                       settings=settings) as dashboard:
                page = await browser.new_page()
                refused: list[str] = []  # the security policy must not block the page
                page.on("console", lambda m: refused.append(m.text)
                        if "Content Security Policy" in m.text else None)
                await page.goto(dashboard.url)
                await until(page, "window.kubemootUpdates >= 1")
                assert await page.locator("#store-lost").is_hidden()

                await server.stop()
                await page.wait_for_selector("#store-lost", state="visible")
                assert await page.locator("#connection").get_attribute("data-state") == "lost"
                assert "has not answered since" in await page.locator("#store-lost").inner_text()
                await page.screenshot(path=str(artifacts / "store-lost.png"), full_page=True)

                await server.start()
                await page.wait_for_selector("#store-lost", state="hidden")
                assert await page.locator("#connection").get_attribute("data-state") == "live"
                assert refused == []
        finally:
            await kv.close()
