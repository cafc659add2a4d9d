"""The one-line log of long-running commands: what `--log-level info` shows."""

from __future__ import annotations

import subprocess
import sys

import pytest

# One request through httpx (which logs each request it sends at INFO) and one access
# line, in a fresh interpreter so the root logger of the test run is left alone.
_SCRIPT = """
import logging, sys
import httpx
from kubemoot.cli._common import install_log_lines
install_log_lines(level=getattr(logging, sys.argv[1]))
with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200))) as c:
    c.get("http://provider.test/api/ps")
logging.getLogger("kubemoot.gateway.access").info("127.0.0.1 anonymous GET /api/ps 200")
"""


@pytest.mark.parametrize(("level", "client_lines"), [("INFO", False), ("DEBUG", True)])
def test_info_shows_access_lines_but_not_each_client_request(
        level: str, client_lines: bool) -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, level], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "anonymous GET /api/ps 200" in done.stderr
    assert ("HTTP Request: GET http://provider.test/api/ps" in done.stderr) is client_lines
