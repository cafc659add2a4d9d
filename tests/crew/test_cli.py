"""``kubemoot agent`` and ``kubemoot ask``: bad input is one line naming the flag or
variable (exit 2); a crew nobody coordinates is one line too (exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubemoot.testing.nats_server import running_nats_server

KUBEMOOT = Path(sys.executable).with_name("kubemoot")


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBEMOOT_")}
    return subprocess.run([str(KUBEMOOT), *args], capture_output=True, text=True,
                          timeout=60, env={**base, **env}, check=False)


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (("agent",), {}, "--name"),
        (("agent", "--name", "a"), {}, "--namespace"),
        (("agent", "--name", "a", "-n", "ns"), {}, "--crew"),
        (("agent", "--name", "a", "-n", "ns", "--crew", "c"), {}, "--nats"),
        (("agent",), {"KUBEMOOT_AGENT_NAME": "a", "KUBEMOOT_AGENT_NAMESPACE": "ns",
                      "KUBEMOOT_CREW": "c", "KUBEMOOT_NATS_URL": "nats://127.0.0.1:1",
                      "KUBEMOOT_MODEL_CANDIDATES_MULLING": "[{"},
         "KUBEMOOT_MODEL_CANDIDATES_MULLING"),
        (("agent",), {"KUBEMOOT_AGENT_NAME": "a", "KUBEMOOT_AGENT_NAMESPACE": "ns",
                      "KUBEMOOT_CREW": "c", "KUBEMOOT_NATS_URL": "nats://127.0.0.1:1",
                      "KUBEMOOT_MODEL_SIZES_MIB": '{"qwen3:8b":"5 GiB"}'},
         "KUBEMOOT_MODEL_SIZES_MIB"),
        (("agent", "--name", "a", "-n", "ns", "--crew", "c", "--nats", "http://x"), {},
         "--nats"),
        (("ask", "--crew", "no-slash", "q"), {}, "--crew"),
        (("ask", "--crew", "ns/c", "  "), {}, "QUESTION"),
        (("ask", "--crew", "ns/c", "q"), {}, "--nats"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(args: tuple[str, ...], env: dict[str, str],
                                              names: str) -> None:
    done = run(*args, **env)
    assert done.returncode == 2, done.stderr
    assert names in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.nats
async def test_asking_a_crew_without_a_coordinator_says_so() -> None:
    async with running_nats_server() as server:
        done = subprocess.run(
            [str(KUBEMOOT), "ask", "--crew", "ns/nobody", "--nats", server.url, "hello"],
            capture_output=True, text=True, timeout=60, check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("KUBEMOOT_")})
    assert done.returncode == 2, done.stderr
    assert "no coordinator of crew ns/nobody" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_table_shows_the_answer_and_where_every_call_ran(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rich.console import Console

    from kubemoot.cli.ask import _print

    monkeypatch.setattr("kubemoot.cli.ask.console", Console(width=200))  # one line a row

    _print({
        "crew": "ns/pilot", "answer": "Roll back the deploy.", "settlement": "synthesis",
        "members": ["ns/a"], "selected": ["ns/a"],
        "signals": [{"type": "failure", "agent": "ns/b",
                     "metadata": {"failureType": "AGENT_ERROR", "lastError": "gone"}}],
        "calls": [{"agent": "ns/a", "phase": "mulling", "provider": "gpu-b",
                   "model": "qwen3:8b", "action": "unload", "evicted": ["phi3:mini"],
                   "waitedSeconds": 1.5, "seconds": 2.25, "ok": True}],
    })
    out, err = capsys.readouterr()
    assert out.startswith("Roll back the deploy.")
    row = next(line for line in out.splitlines() if "ns/a" in line and "mulling" in line)
    for cell in ("gpu-b", "qwen3:8b", "unload", "phi3:mini", "1.50", "2.25", "yes"):
        assert cell in row
    assert "ns/b: failure (AGENT_ERROR: gone)" in err
