"""``kubemoot demo`` end to end, as a user runs it: a subprocess printing one JSON object."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kubemoot.testing.nats_server import running_nats_server

KUBEMOOT = str(Path(sys.executable).with_name("kubemoot"))


def _demo(*extra: str) -> dict[str, Any]:
    result = subprocess.run(
        [KUBEMOOT, "demo", "-o", "json", "--time-scale", "0.04", *extra],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)  # exactly one JSON object
    return report


def _check(report: dict[str, Any], discussions: int) -> None:
    assert report["discussions"] == discussions
    assert report["overcommits"] == 0
    calls = report["calls"]
    assert calls, "a demo without calls shows nothing"
    for call in calls:
        assert set(call) >= {"agent", "phase", "model", "provider", "waitedSeconds", "evicted"}
    # Every call's provider is the one that really served it: per provider and model,
    # the engine requests attributed to calls equal what that emulator received.
    attributed: Counter[tuple[str, str]] = Counter()
    for call in calls:
        attributed[(call["provider"], call["model"])] += call["modelCalls"]
    received = Counter({
        (name, model): count
        for name, provider in report["providers"].items()
        for model, count in provider["requests"].items()
    })
    assert attributed == received
    # every eviction a call reports is an unload the runtime sent to that provider
    for call in calls:
        for victim in call["evicted"]:
            assert victim in report["providers"][call["provider"]]["unloads"]
    for provider in report["providers"].values():
        assert provider["peakVramMiB"] <= provider["usableMiB"]
        assert provider["engineEvictions"] == []
        assert provider["truncatedRequests"] == 0
    unanswered = report["discussions"] - report["answered"]
    explained = sum(n for s, n in report["settlements"].items() if s != "synthesis")
    assert unanswered == explained
    if unanswered:
        assert report["standAsides"] or report["failures"]
    # contention: warm reuse, cold loads, and a wait or an eviction
    assert report["warmCalls"] > 0 and report["coldLoads"] > 0
    assert report["waits"] + report["evictions"] > 0


def test_demo_on_the_embedded_store() -> None:
    report = _demo("--discussions", "6", "--seed", "3")
    _check(report, 6)
    assert report["store"] == "memory"
    assert report["answered"] == 6


@pytest.mark.nats
def test_demo_on_a_real_nats_server() -> None:
    async def run() -> dict[str, Any]:
        async with running_nats_server() as server:
            return await asyncio.to_thread(
                _demo, "--discussions", "4", "--seed", "5", "--nats", server.url
            )

    report = asyncio.run(run())
    _check(report, 4)
    assert report["store"] == "nats"


def test_demo_table_output_names_the_emulator() -> None:
    result = subprocess.run(
        [KUBEMOOT, "demo", "--discussions", "2", "--time-scale", "0.02"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Per-call attribution" in result.stdout
    assert "emulat" in result.stdout


def test_demo_with_a_missing_bundle_is_bad_input(tmp_path: Path) -> None:
    result = subprocess.run(
        [KUBEMOOT, "demo", "-f", str(tmp_path / "nope")], capture_output=True, text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "nope" in result.stderr
