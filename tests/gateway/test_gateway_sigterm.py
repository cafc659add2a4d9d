"""SIGTERM (what Kubernetes sends) stops a gateway cleanly: the call in flight ends,
its ticket is released at once (not left for the TTL), and the process exits 143."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Callable

import httpx
import pytest

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.testing.nats_server import NatsServer, free_port
from tests.gateway.test_replicas import (
    KUBEMOOT,
    _serving,
    _tickets,
    _until_tickets,
)

pytestmark = pytest.mark.nats


async def test_sigterm_releases_the_ticket_of_a_call_in_flight(
        nats: NatsServer, make_emulator: Callable[..., OllamaEmulator]) -> None:
    # One emulated call lasts about a minute: it is surely running when the signal comes.
    emulator = make_emulator(time_scale=1.0, base_latency_s=60.0)
    port = free_port()
    process = subprocess.Popen(
        [*KUBEMOOT, "gateway", "--nats", nats.url, "--listen", f"127.0.0.1:{port}",
         "--provider", f"gpu-a={emulator.url},vramMiB=8192,numParallel=2,contextLength=1024"],
        env={**os.environ, "KUBEMOOT_DEBUG": "0"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        await _serving(url, process)
        async with httpx.AsyncClient(timeout=120) as http:
            call = asyncio.create_task(http.post(f"{url}/api/generate", json={
                "model": "small:1b", "prompt": "hello", "stream": False}))
            await _until_tickets(nats.url, held=True, what="the call claiming its ticket")
            # and sent: a call placed but not yet sent when the drain begins is refused
            # without reaching the engine (test_stream_faults.py), not cut
            await emulator.until(lambda engine: bool(engine.records))
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=60)
            cut = await call
        # the client learns why, in Ollama's shape (was uvicorn's text "Internal Server
        # Error", a 500)
        assert cut.status_code == 503, cut.text
        assert "shutting down" in cut.json()["error"]
        assert cut.headers["retry-after"] == "1"
        assert process.returncode == 128 + signal.SIGTERM, err
        assert "terminated" in err.decode()
        # the call cut short by the shutdown is one line, not uvicorn's traceback
        assert "Traceback" not in err.decode() and "CancelledError" not in err.decode()
        assert "cut short by the shutdown" in err.decode()
        assert "never retrieved" not in err.decode()
        assert f"store: {nats.url};" in err.decode()  # was spelled out a character apiece
        assert await _tickets(nats.url) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
async def test_sigterm_ends_a_long_stream_with_a_final_error_line(
        nats: NatsServer, make_emulator: Callable[..., OllamaEmulator],
        path: str) -> None:
    """Issue 22 fault 3: a stream still running when the grace ends is cut with an error
    line the client's library raises, never a silent 200 that merely stops."""
    # the first word comes at once, the next a minute later: the stream is surely running
    emulator = make_emulator(time_scale=1.0, base_latency_s=0.0, per_token_s=60.0)
    port = free_port()
    process = subprocess.Popen(
        [*KUBEMOOT, "gateway", "--nats", nats.url, "--listen", f"127.0.0.1:{port}",
         "--provider", f"gpu-a={emulator.url},vramMiB=8192,numParallel=2,contextLength=1024"],
        env={**os.environ, "KUBEMOOT_DEBUG": "0"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        await _serving(url, process)
        async with httpx.AsyncClient(timeout=120) as http:
            body = {"model": "small:1b", "stream": True,
                    "messages": [{"role": "user", "content": "hello"}]}
            async with http.stream("POST", f"{url}{path}", json=body) as reply:
                lines = (line async for line in reply.aiter_lines() if line.strip())
                first = await anext(lines)
                process.send_signal(signal.SIGTERM)
                rest = [line async for line in lines]
            _out, err = await asyncio.to_thread(process.communicate, timeout=60)
        assert reply.status_code == 200 and '"error"' not in first
        assert rest, "the stream ended without a final line"
        if path.startswith("/v1/"):  # an SSE event in OpenAI's error shape
            assert rest[-1].startswith("data: "), rest
            error = json.loads(rest[-1].removeprefix("data: "))["error"]
            assert error["code"] == "shutdown"
            message = error["message"]
        else:  # an NDJSON line in Ollama's
            message = json.loads(rest[-1])["error"]
        assert "shut down before the answer was complete" in message, rest
        assert process.returncode == 128 + signal.SIGTERM, err
        assert "Traceback" not in err.decode() and "CancelledError" not in err.decode()
        assert await _tickets(nats.url) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
