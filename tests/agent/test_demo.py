"""``kubemoot demo`` end to end, as a user runs it: a subprocess printing one JSON object."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
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


# -- the default bundle is package data ------------------------------------------------


def test_the_default_bundle_is_package_data_that_loads() -> None:
    from importlib.resources import files

    import kubemoot
    from kubemoot.api.loader import load_bundle
    from kubemoot.demo import default_bundle

    shipped = files("kubemoot") / "examples" / "homelab"
    assert sorted(f.name for f in shipped.iterdir() if f.name.endswith(".yaml")) == [
        "crew.yaml", "models.yaml", "policy.yaml", "providers.yaml",
    ]
    with default_bundle() as path:
        # inside the installed package, not wherever a repository checkout happens to be
        assert path.resolve().is_relative_to(Path(kubemoot.__file__).resolve().parent)
        bundle = load_bundle([path])
    assert sorted(p.name for p in bundle.providers) == ["rtx4090", "rtx5090"]
    assert "coordinator" in {a.name for a in bundle.agents}


def test_the_demo_default_does_not_depend_on_the_current_directory(tmp_path: Path) -> None:
    result = subprocess.run(
        [KUBEMOOT, "demo", "-o", "json", "--discussions", "2", "--time-scale", "0.02"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)["providers"]) == {"rtx4090", "rtx5090"}


# -- Ctrl-C ----------------------------------------------------------------------------


def _interrupt(process: subprocess.Popen[str]) -> tuple[int, str]:
    process.send_signal(signal.SIGINT)
    _out, err = process.communicate(timeout=60)
    return process.returncode, err


def _assert_clean_interrupt(code: int, err: str) -> None:
    assert code == 130, err
    assert "Traceback" not in err
    assert "Task exception" not in err
    assert "closed" not in err  # nothing ran on after the store was closed
    assert err.strip().splitlines()[-1] == "interrupted"


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _demo_on_a_terminal(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    """``kubemoot demo`` as if on a terminal: its live progress view draws on stderr."""
    env = {k: v for k, v in os.environ.items() if k not in {"NO_COLOR", "TTY_COMPATIBLE"}}
    env.update(FORCE_COLOR="1", TERM="xterm", COLUMNS="120")
    return subprocess.Popen(
        [KUBEMOOT, "demo", "--discussions", "8", *extra], cwd=tmp_path, text=True, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def _read_until(process: subprocess.Popen[str], needle: str, what: str) -> list[str]:
    """The stderr lines up to the first that contains ``needle`` (colours removed)."""
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if needle in _ANSI.sub("", line):
            return seen
    raise AssertionError(f"the demo never {what}: {''.join(seen)}")


def test_ctrl_c_mid_run_shuts_down_quietly(tmp_path: Path) -> None:
    # The progress view's first row naming a placed call ("→") proves the discussions
    # are running, whatever the machine's speed, so the interrupt never lands while the
    # CLI is still importing.
    process = _demo_on_a_terminal(tmp_path)
    seen = _read_until(process, "→", "showed a placed call")
    code, err = _interrupt(process)
    _assert_clean_interrupt(code, _ANSI.sub("", "".join(seen) + err))


def test_ctrl_c_while_discussions_run_with_the_dashboard(tmp_path: Path) -> None:
    # The dashboard is announced before the discussions start; the first placed call
    # after it shows the interrupt lands among calls in flight.
    process = _demo_on_a_terminal(tmp_path, "--dashboard", "--dashboard-port", "0")
    seen = _read_until(process, "dashboard: ", "announced its dashboard")
    seen += _read_until(process, "→", "showed a placed call")
    code, err = _interrupt(process)
    _assert_clean_interrupt(code, _ANSI.sub("", "".join(seen) + err))


# -- NATS that is not there ------------------------------------------------------------


def test_an_unreachable_nats_is_announced_and_given_up_on(tmp_path: Path) -> None:
    result = subprocess.run(
        [KUBEMOOT, "demo", "--nats", "nats://127.0.0.1:1"], cwd=tmp_path,
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "KUBEMOOT_CONNECT_WAIT_SECONDS": "2"},
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "connecting to NATS at nats://127.0.0.1:1 (gives up after 2 s) …"
    assert lines[-1].startswith("error: StoreUnavailable: cannot connect to NATS at "
                                "nats://127.0.0.1:1")
    assert "Traceback" not in result.stderr


def _live_demo(*args: str, env: dict[str, str] | None = None) -> tuple[
        subprocess.Popen[str], list[str]]:
    """A demo whose live view draws on stderr, read until a call has been placed ("→")."""
    env = {k: v for k, v in (env or os.environ).items()
           if k not in {"NO_COLOR", "TTY_COMPATIBLE"}}
    env.update(FORCE_COLOR="1", TERM="xterm", COLUMNS="120")
    process = subprocess.Popen([KUBEMOOT, "demo", *args], text=True, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if "→" in line:
            return process, seen
    raise AssertionError(f"the demo never showed a placed call: {''.join(seen)}")


async def _active_tickets(url: str) -> dict[str, list[dict[str, Any]]]:
    from kubemoot.settings import NatsSettings
    from kubemoot.store.documents import PROVIDER_TICKETS_BUCKET, ProviderTickets
    from kubemoot.store.nats import NatsKV

    kv = await NatsKV.connect(NatsSettings(servers=[url]))
    try:
        bucket = await kv.bucket(PROVIDER_TICKETS_BUCKET)
        found = {}
        for key in await bucket.keys():
            entry = await bucket.get(key)
            assert entry is not None
            doc = ProviderTickets.from_json(entry.value)
            found[doc.provider] = [t.model_dump(by_alias=True) for t in doc.tickets]
        return found
    finally:
        await kv.close()


@pytest.mark.nats
def test_sigterm_mid_run_releases_every_ticket_on_nats(tmp_path: Path) -> None:
    """What Kubernetes sends: the run shuts down in order and leaves no ticket behind,
    instead of leaving every ticket to its TTL."""
    async def run() -> tuple[int, str, dict[str, list[dict[str, Any]]],
                             dict[str, list[dict[str, Any]]]]:
        async with running_nats_server() as server:
            process, seen = await asyncio.to_thread(
                _live_demo, "--discussions", "8", "--nats", server.url)
            before = await _active_tickets(server.url)
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=60)
            after = await _active_tickets(server.url)
            return process.returncode, _ANSI.sub("", "".join(seen) + err), before, after

    code, err, before, after = asyncio.run(run())
    assert any(before.values()), "the demo held no ticket when it was stopped"
    assert after and not any(after.values()), after
    assert code == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "terminated"


@pytest.mark.nats
def test_a_lost_nats_is_one_line_and_the_demo_carries_on_when_it_returns() -> None:
    async def run() -> tuple[int, str]:
        async with running_nats_server() as server:
            env = {**os.environ, "KUBEMOOT_STORE_CHECK_SECONDS": "0.5"}
            process, seen = await asyncio.to_thread(
                _live_demo, "--discussions", "4", "--nats", server.url, env=env)
            await server.stop()
            assert process.stderr is not None
            while True:  # the one line that says the store is gone
                line = await asyncio.to_thread(process.stderr.readline)
                assert line, "the demo ended without saying it lost NATS"
                seen.append(line)
                if "lost the shared state" in line:
                    break
            await server.start()
            _out, err = await asyncio.to_thread(process.communicate, timeout=120)
            return process.returncode, _ANSI.sub("", "".join(seen) + err)

    code, err = asyncio.run(run())
    assert code == 0, err
    assert "Traceback" not in err
    # One line when the store check finds NATS gone and one when it answers again, in
    # turn. A check that waits longer than its 0.5 s for an answer on a loaded machine
    # reports a second, short loss and its end the same way (1 run in 15 under load):
    # that is no line per failed operation. (The live view may draw a line printed
    # under it twice, so repeated "answers again" lines count once.)
    turns: list[str] = []
    for line in err.splitlines():
        if "lost the shared state (NATS at" in line:
            turns.append("lost")
        elif "answers again" in line and turns[-1:] == ["lost"]:
            turns.append("back")
    assert turns and turns == ["lost", "back"] * (len(turns) // 2), err
    # no line per failed operation while it was away
    assert "failed" not in err, err


# -- the attribution table in 80 columns -----------------------------------------------


def _call(thread: str, agent: str, model: str, provider: str, *, phase: str = "mulling",
          action: str = "cold-load", evicted: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"threadId": thread, "agent": agent, "phase": phase, "model": model,
            "provider": provider, "action": action, "waitedSeconds": 12.5,
            "evicted": list(evicted)}


@pytest.mark.parametrize(
    ("calls", "names"),
    [
        pytest.param(
            [_call("thread-12", "crew-homelab-pilot/prometheus-agent", "qwen3:32b", "rtx5090",
                   phase="synthesis", evicted=("qwen3:8b", "qwen3:14b")),
             _call("thread-3", "crew-homelab-pilot/kubectl-agent", "qwen3:8b", "rtx4090",
                   action="loading")],
            ["qwen3:32b", "qwen3:8b", "rtx5090", "rtx4090", "synthesis", "cold-load",
             "prometheus-agent", "kubectl-agent"],
            id="homelab",
        ),
        pytest.param(
            # only the agent and evicted columns may fold to make room
            [_call("thread-40", "a-rather-long-namespace/capacity-planner-agent",
                   "qwen2.5-coder:32b", "workstation-a6000", phase="synthesis",
                   evicted=("llama3.1:70b",))],
            ["qwen2.5-coder:32b", "workstation-a6000", "cold-load", "synthesis"],
            id="longer-names",
        ),
    ],
)
def test_the_attribution_table_keeps_models_and_providers_whole_in_80_columns(
    calls: list[dict[str, Any]], names: list[str]
) -> None:
    from rich.console import Console

    from kubemoot.cli.demo import attribution_table

    buffer = io.StringIO()
    Console(width=80, file=buffer, color_system=None).print(attribution_table(calls))
    text = buffer.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text
    rows = text.splitlines()
    for name in names:
        assert any(name in row for row in rows), (name, text)
    assert "crew-homelab-pilot" not in text and "a-rather-long-namespace" not in text
    assert "thread-" not in text  # thread ids are shortened to their number
