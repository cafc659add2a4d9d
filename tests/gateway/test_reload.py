"""Adding a server needs no restart: the config file is reloaded when it changes and on
SIGHUP; a bad reload keeps the running config."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kubemoot.clock import SystemClock
from kubemoot.gateway import GatewayServer
from kubemoot.gateway.config import load_config
from kubemoot.gateway.reload import ConfigReloader, assemble_fleet
from kubemoot.store.memory import MemoryKV
from tests.gateway.conftest import OllamaEmulator  # the emulator, wherever it lives
from tests.providers.test_cli import KUBEMOOT

HELLO = {"messages": [{"role": "user", "content": "hello"}], "stream": False}


def config_text(servers: dict[str, OllamaEmulator], *, probe: str) -> str:
    lines = ["servers:"]
    for name, emulator in servers.items():
        lines += [f"  {name}:", f"    url: {emulator.url}",
                  f"    vramMiB: {emulator.config.vram_mib}",
                  "    reserveMiB: 512", "    numParallel: 2", "    contextLength: 1024"]
    return "\n".join([*lines, "limits:", f"  probeInterval: {probe}", ""])


async def test_a_server_added_to_the_file_takes_calls_without_a_restart(
        make_emulator: Callable[..., OllamaEmulator], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # medium:7b (4000 MiB) fits only on b
    a, b = make_emulator(vram_mib=3072), make_emulator()
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text({"a": a}, probe="50ms"))
    first = assemble_fleet(load_config(path))
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=first.providers, port=0,
                            settings=first.settings)
    lines: list[str] = []
    reloaded = asyncio.Event()

    def announce(line: str) -> None:
        lines.append(line)
        reloaded.set()

    reloader = ConfigReloader(path, gateway, assemble_fleet, announce=announce)
    gateway.before_probe = reloader.check  # what the CLI wires: the probe tick looks
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            before = await http.post("/api/chat", json={"model": "medium:7b", **HELLO})
            assert before.status_code == 400 and "larger than" in before.text

            path.write_text(config_text({"a": a, "b": b}, probe="50ms"))
            await asyncio.wait_for(reloaded.wait(), timeout=30)
            assert lines == [f"gateway: reloaded {path} (the file changed): added server b"]
            for action in ("cold-load", "warm"):  # and the second time, warm there
                after = await http.post("/api/chat", json={"model": "medium:7b", **HELLO})
                assert after.status_code == 200, after.text
                assert after.headers["x-kubemoot-provider"] == "b"
                assert after.headers["x-kubemoot-action"] == action

            # a bad file: the error names the file and field, the running fleet stays
            path.write_text(config_text({"a": a, "b": b}, probe="50ms")
                            + "  waitLimit: soon\n")
            with caplog.at_level(logging.ERROR, logger="kubemoot.gateway.reload"):
                assert await reloader.reload("test") is False
            assert f"{path}, field limits.waitLimit" in caplog.text
            assert "the running config stays" in caplog.text
            still = await http.post("/api/chat", json={"model": "medium:7b", **HELLO})
            assert still.headers["x-kubemoot-provider"] == "b"

            # the server taken out of the file gets no more calls
            reloaded.clear()
            path.write_text(config_text({"a": a}, probe="50ms"))
            await asyncio.wait_for(reloaded.wait(), timeout=30)
            assert lines[-1].endswith("removed server b")
            gone = await http.post("/api/chat", json={"model": "medium:7b", **HELLO})
            assert gone.status_code == 400 and "larger than" in gone.text
    finally:
        await gateway.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class _Lines:
    """A subprocess's stderr, line by line, waited on with a timeout (no polling)."""

    def __init__(self, stream: object) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self._queue.put(line)

    def until(self, words: str, timeout: float = 60.0) -> str:
        while True:
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line with {words!r} in {self.seen}") from None
            self.seen.append(line)
            if words in line:
                return line


def test_sighup_reloads_a_running_kubemoot_gateway(
        make_emulator: Callable[..., OllamaEmulator], tmp_path: Path) -> None:
    a, b = make_emulator(vram_mib=3072), make_emulator()  # medium:7b fits only on b
    path = tmp_path / "gateway.yaml"
    # an hour between probes: only the signal can make this reload happen
    path.write_text(config_text({"a": a}, probe="1h"))
    port = _free_port()
    env = {**os.environ, "COLUMNS": "300"}
    env.pop("KUBEMOOT_DEBUG", None)
    process = subprocess.Popen([KUBEMOOT, "gateway", "-c", str(path), "--listen",
                                f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        lines = _Lines(process.stderr)
        lines.until("Ctrl-C stops it")
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.post("/api/chat", json={"model": "medium:7b", **HELLO}
                             ).status_code == 400
            path.write_text(config_text({"a": a, "b": b}, probe="1h"))
            process.send_signal(signal.SIGHUP)
            assert "(SIGHUP): added server b" in lines.until("reloaded")
            reply = http.post("/api/chat", json={"model": "medium:7b", **HELLO})
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-kubemoot-provider"] == "b"
            # the process took the signal as a reload, not as a reason to stop
            assert process.poll() is None
    finally:
        process.terminate()
        process.wait(timeout=60)


async def test_a_reload_swaps_the_keys(make_emulator: Callable[..., OllamaEmulator],
                                       tmp_path: Path) -> None:
    a = make_emulator()
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text({"a": a}, probe="1h") + "keys: {alice: sk-alice}\n")
    first = assemble_fleet(load_config(path))
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=first.providers, port=0,
                            settings=first.settings, keys=first.keys)
    reloader = ConfigReloader(path, gateway, assemble_fleet, announce=lambda line: None)
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            alice = {"Authorization": "Bearer sk-alice"}
            assert (await http.get("/api/tags", headers=alice)).status_code == 200
            path.write_text(config_text({"a": a}, probe="1h") + "keys: {bob: sk-bob}\n")
            assert await reloader.reload("test")
            assert (await http.get("/api/tags", headers=alice)).status_code == 401
            bob = {"Authorization": "Bearer sk-bob"}
            assert (await http.get("/api/tags", headers=bob)).status_code == 200
    finally:
        await gateway.stop()
