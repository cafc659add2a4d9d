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


def test_a_survived_store_loss_is_left_to_the_store_check_and_other_errors_are_said(
        caplog: pytest.LogCaptureFixture) -> None:
    # The demo said "lost the shared state" once, yet a probe's read that timed out
    # after NATS was back printed its own line: the filter saw the error only as text.
    from kubemoot import metrics
    from kubemoot.cli._common import StoreLossFilter
    from kubemoot.store.protocol import StoreUnavailable

    with caplog.at_level("WARNING"):
        metrics.survived("prober", "read-state", metrics.STORE, "reading the state failed",
                         StoreUnavailable("get kubemoot_provider_state/a: timeout"))
        metrics.survived("prober", "read-state", metrics.STORE, "reading the state failed",
                         ValueError("not JSON"))
    lost, unreadable = caplog.records[-2:]
    assert lost.getMessage() == ("reading the state failed: get kubemoot_provider_state/a: "
                                 "timeout (StoreUnavailable)")
    assert not StoreLossFilter().filter(lost)
    assert StoreLossFilter().filter(unreadable)
    assert unreadable.getMessage() == "reading the state failed: not JSON (ValueError)"
