"""``kubemoot dashboard`` names ``--host`` for a bad address, ``--port`` for a taken port."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

KUBEMOOT = Path(sys.executable).with_name("kubemoot")


def dashboard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBEMOOT), "dashboard", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_an_address_that_does_not_resolve_names_host() -> None:
    done = dashboard("--host", "999.1.1.1", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "field --host: '999.1.1.1' is not an address to listen on" in done.stderr
    assert "--port" not in done.stderr and "Traceback" not in done.stderr


def test_a_taken_port_names_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = dashboard("--host", "127.0.0.1", "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert f"field --port: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
