"""Edges of ``kubemoot probe`` and ``kubemoot emulate-ollama`` as users hit them.

A plain web server is not Ollama: its 404 page must come back as one short line saying
so, never as raw HTML. Malformed flags are exit 2 naming the flag.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider

KUBEMOOT = Path(sys.executable).with_name("kubemoot")


def kubemoot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBEMOOT), *args], capture_output=True, text=True,
                          timeout=60, check=False)


@contextmanager
def serving(handler: Callable[..., BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def answering(status: int, body: bytes, content_type: str = "text/html") -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib's name for it
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass  # keep the test output clean

    return Handler


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def probe_reason(url: str) -> str:
    done = kubemoot("probe", url, "-o", "json")
    assert done.returncode == 0, done.stderr  # a provider that is down is not bad input
    [state] = json.loads(done.stdout)
    assert state["ready"] is False
    return str(state["reason"])


def test_a_plain_web_server_is_not_an_ollama_endpoint(tmp_path: Path) -> None:
    # what `python -m http.server` answers: an HTML 404 page
    with serving(partial(QuietFiles, directory=str(tmp_path))) as url:
        reason = probe_reason(url)
    assert reason == "HTTP 404 from GET /api/ps: not an Ollama API endpoint"


def test_an_empty_404_says_so_too() -> None:
    with serving(answering(404, b"")) as url:
        reason = probe_reason(url)
    assert reason == "HTTP 404 from GET /api/ps: not an Ollama API endpoint"


def test_an_html_error_page_is_summarised_by_its_title() -> None:
    page = (b"<html><head><title>502 Bad Gateway</title></head><body>\n<center>"
            + b"nginx " * 200 + b"</center></body></html>")
    with serving(answering(502, page)) as url:
        reason = probe_reason(url)
    assert reason.startswith("HTTP 502 from GET /api/ps: HTML page '502 Bad Gateway'")
    assert "not an Ollama API endpoint" in reason
    assert "<" not in reason and "\n" not in reason and len(reason) < 200


def test_a_long_text_error_is_one_short_line() -> None:
    body = ("line one\nline two " + "x" * 500).encode()
    with serving(answering(500, body, "text/plain")) as url:
        reason = probe_reason(url)
    assert reason.startswith("HTTP 500 from GET /api/ps: line one line two")
    assert "\n" not in reason and len(reason) < 200


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["probe", "=http://127.0.0.1:1"], "field endpoint: '=http://127.0.0.1:1' has an empty "
                                           "NAME"),
        (["probe", "http://127.0.0.1:1", "--dcgm", "notaurl"], "field --dcgm: 'notaurl' is not"),
        (["probe", "http://127.0.0.1:1", "--dcgm", "http://h:99999/m"], "field --dcgm:"),
        (["emulate-ollama", "--port", "0", "--model", "q=abc"],
         "--model q=abc: size must be whole MiB, e.g. qwen3:8b=6144"),
        (["emulate-ollama", "--port", "0", "--model", "q=0"], "--model q=0: size must be positive"),
        (["emulate-ollama", "--port", "0", "--model", "6144"], "--model 6144: expected NAME=MiB"),
        (["emulate-ollama", "--host", "999.1.1.1"], "field --host: '999.1.1.1'"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args: list[str], needle: str) -> None:
    done = kubemoot(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert needle in done.stderr
    assert "Traceback" not in done.stderr and "invalid literal" not in done.stderr


@pytest.mark.parametrize(
    ("total", "wording"),
    [(None, "the VRAM total stays unknown"),
     (16384, "using the configured VRAM total (16384 MiB)")],
)
async def test_a_dcgm_failure_says_what_the_total_becomes(
    emulator: OllamaEmulator, caplog: pytest.LogCaptureFixture, total: int | None,
    wording: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="kubemoot.providers.ollama")
    async with OllamaProvider("emu", emulator.url, total_vram_mib=total, timeout=5,
                              dcgm_url="http://127.0.0.1:1/metrics") as provider:
        state = await provider.probe()
    assert state.total_vram_mib == total
    assert wording in caplog.text
