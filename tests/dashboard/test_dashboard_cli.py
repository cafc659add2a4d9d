"""``kubemoot dashboard`` as a user runs it: bad input exits 2, a good run serves."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

KUBEMOOT = Path(sys.executable).with_name("kubemoot")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBEMOOT), "dashboard", *args], capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--nats", "nats://127.0.0.1:4222", "--embedded"], "exclude each other",
                     id="both-stores"),
        pytest.param(["--nats", "http://127.0.0.1:4222"], "unknown store URL", id="bad-url"),
    ],
)
def test_dashboard_cli_rejects_bad_input(args: list[str], message: str) -> None:
    done = run(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_dashboard_cli_port_in_use_is_bad_input() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        done = run("--port", str(taken.getsockname()[1]))
    assert done.returncode == 2, done.stderr
    assert "cannot listen on 127.0.0.1" in done.stderr
    assert "Traceback" not in done.stderr


def test_dashboard_cli_serves_embedded_store() -> None:
    with subprocess.Popen([str(KUBEMOOT), "dashboard", "--port", "0"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            assert line.startswith("dashboard: http://127.0.0.1:"), line
            url = line.split()[1]
            state = httpx.get(f"{url}/api/state", timeout=10).json()
            assert state["providers"] == [] and state["agents"] == []
            assert httpx.get(f"{url}/healthz", timeout=10).text == "ok"
            assert httpx.post(f"{url}/api/state", timeout=10).status_code == 405
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_sigterm_stops_the_dashboard_cleanly() -> None:
    """What Kubernetes sends: the page stops, the store closes, one line, exit 143."""
    import signal

    with subprocess.Popen([str(KUBEMOOT), "dashboard", "--port", "0"], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("dashboard: http://127.0.0.1:"), line
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["terminated"]
