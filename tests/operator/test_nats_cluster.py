"""The prod overlay's shared state: a three-node JetStream cluster, buckets replicated 3×.

Three ``nats-server`` processes on loopback form one cluster. Claimer processes claim
and release VRAM tickets through it; one server is SIGKILLed while they all claim. Every
claimer is granted again after the kill (through the other two), no ticket is lost or
leaked, and the budget is never overcommitted. A second test shows that whichever client
creates a bucket first, the operator's opening raises it to three copies.

An earlier form of this test once stalled on a loaded machine: one claimer refused for a
minute before any kill while the ticket document read back empty. Its cause was never
pinned down. The likeliest one, a replica answering direct gets with stale documents,
cannot happen any more (replicated buckets read through the stream leader); the stall
did not recur in over 200 later runs (120 of them on a busy two-core machine, 20 pinned
to one core), nor in 50 runs with direct gets put back. Should a claimer stall, the
failure names each claimer's server, every distinct reason it was refused, the ticket
document (with its ``line``), the provider state and the tail of each server's log.

Every process here dies with the test process (``PR_SET_PDEATHSIG``): a failed,
timed-out or interrupted run leaves no ``nats-server`` or claimer behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from kubemoot.clock import SystemClock
from kubemoot.operator.run import open_shared_buckets
from kubemoot.runtime.tickets import TicketManager
from kubemoot.settings import NatsSettings
from kubemoot.store.documents import (
    MODEL_DEMAND_BUCKET,
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    ProviderState,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV
from kubemoot.store.protocol import StoreError
from kubemoot.testing.nats_server import find_nats_server, free_port

CLAIMER = str(Path(__file__).with_name("_cluster_claimer.py"))
ROOT = str(Path(__file__).resolve().parents[2])
GIB = 1024
PROVIDER = "gpu-a"
READY_DEADLINE = 60.0  # seconds for the cluster to elect a JetStream leader
LISTEN_DEADLINE = 20.0  # seconds for a started server to bind its ports
START_ATTEMPTS = 3  # fresh ports when one picked was taken before the server bound it
GRANT_DEADLINE = 60.0  # seconds for a claimer's first grant
FINISH_DEADLINE = 120.0  # seconds for the claimers' rounds after the kill
SERVER_LOG_LINES = 20  # of each server's log in a failure report
ROUNDS_AFTER_KILL = 6  # claims each claimer task makes once the server is dead
T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_the_test() -> None:
    """In the child before it runs: SIGKILL it when the test process dies (Linux).

    A finally block does not run when pytest itself is killed; the kernel still ends
    the servers and claimers then.
    """
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Cluster:
    """Three clustered JetStream servers on loopback."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="nats-cluster-")
        self.processes: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []
        self.routes: list[int] = []

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.ports]

    def log(self, index: int) -> Path:
        return Path(self.dir) / f"n{index}.log"

    async def start(self) -> None:
        """Start the servers and wait until each listens; fresh ports if one was taken."""
        for attempt in range(START_ATTEMPTS):
            ports = distinct_ports(6)
            self.ports, self.routes = ports[:3], ports[3:]
            self._spawn(attempt)
            failure = await self._listening()
            if failure is None:
                return
            self._kill_all()
        raise AssertionError(f"the cluster did not start: {failure}")

    def _spawn(self, attempt: int) -> None:
        routes = ",".join(f"nats://127.0.0.1:{port}" for port in self.routes)
        self.processes = []
        for index, (port, route) in enumerate(zip(self.ports, self.routes, strict=True)):
            store = Path(self.dir) / f"store{attempt}-{index}"
            store.mkdir()
            with self.log(index).open("ab") as log:
                self.processes.append(subprocess.Popen(
                    [find_nats_server(), "-js", "-a", "127.0.0.1", "-p", str(port),
                     "-sd", str(store), "--server_name", f"n{index}",
                     "--cluster_name", "kubemoot", "--cluster", f"nats://127.0.0.1:{route}",
                     "--routes", routes],
                    stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_the_test,
                ))

    async def _listening(self) -> str | None:
        """None once every server listens on both its ports; else why one did not."""
        loop = asyncio.get_running_loop()
        end = loop.time() + LISTEN_DEADLINE
        waiting = set(range(3))
        while waiting:
            for index in list(waiting):
                text = self.log(index).read_text(errors="replace")
                if self.processes[index].poll() is not None:
                    return f"n{index} exited: {text[-500:]}"
                if (f"client connections on 127.0.0.1:{self.ports[index]}" in text
                        and f"route connections on 127.0.0.1:{self.routes[index]}" in text):
                    waiting.discard(index)
            if loop.time() > end:
                return f"n{sorted(waiting)} did not listen within {LISTEN_DEADLINE} s"
            await asyncio.sleep(0.02)
        return None

    def kill(self, index: int) -> None:
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait()

    def _kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    def stop(self) -> None:
        self._kill_all()
        shutil.rmtree(self.dir, ignore_errors=True)


def distinct_ports(count: int) -> list[int]:
    """``count`` different free ports: the kernel may hand one freed port out again."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@contextlib.asynccontextmanager
async def three_node_cluster() -> AsyncIterator[Cluster]:
    cluster = Cluster()
    try:
        await cluster.start()
        yield cluster
    finally:
        cluster.stop()


async def connected(cluster: Cluster, *, replicas: int) -> NatsKV:
    """A client of the cluster, once a server accepts it."""
    return await until_served(lambda: NatsKV.connect(NatsSettings(
        servers=cluster.urls, replicas=replicas, max_reconnect_attempts=5)))


async def replicated_buckets(cluster: Cluster) -> tuple[NatsKV, str, str]:
    """Connect and create both buckets with 3 replicas once the cluster has a leader."""
    kv = await connected(cluster, replicas=3)
    tickets = await until_served(lambda: kv.bucket("tickets"))
    states = await until_served(lambda: kv.bucket("states"))
    return kv, tickets.name, states.name


async def until_served(make: Callable[[], Awaitable[T]]) -> T:
    """``make()``'s answer, asked again while the cluster elects leaders (StoreError)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + READY_DEADLINE
    while True:
        try:
            return await make()
        except StoreError:
            if loop.time() > end:
                raise
            await asyncio.sleep(0.2)


async def stall_report(what: str, kv: NatsKV, cluster: Cluster, tickets_name: str,
                       states_name: str, logs: list[Path]) -> str:
    """What the claimers saw and said, and the documents they decided on."""
    key = encode_token(PROVIDER)
    lines = [what, f"this cluster's servers: {', '.join(cluster.urls)}"]
    for name in (tickets_name, states_name):
        try:
            entry = await (await kv.bucket(name)).get(key)
            lines.append(f"{name}/{key}: {entry.value.decode() if entry else None}")
        except StoreError as error:
            lines.append(f"{name}/{key}: unreadable: {error}")
    lines += [f"--- {log.name}\n{log.read_text()}" for log in logs]
    for index in range(3):  # leader elections and lagging replicas show up here
        tail = cluster.log(index).read_text(errors="replace").splitlines()[-SERVER_LOG_LINES:]
        lines += [f"--- n{index}.log (last {SERVER_LOG_LINES} lines)", *tail]
    return "\n".join(lines)


def overcommits(intervals: list[tuple[float, float, int]], usable: int) -> int:
    """Grants at which the tickets held (as the claimers recorded them) exceed ``usable``.

    A claimer records a ticket from after its grant was confirmed until before it asks
    to release it, inside the time the ticket really existed: an overlap seen here was
    a real one.
    """
    count = 0
    for granted, _released, _ in intervals:
        held = sum(f for g, r, f in intervals if g <= granted < r)
        count += held > usable
    return count


@pytest.mark.nats
@pytest.mark.slow
async def test_claims_continue_when_one_of_three_servers_dies() -> None:
    async with three_node_cluster() as cluster:
        kv, tickets_name, states_name = await replicated_buckets(cluster)
        processes: list[asyncio.subprocess.Process] = []
        try:
            for name in (tickets_name, states_name):
                stream = await kv._js.stream_info(f"KV_{name}")
                assert stream.config.num_replicas == 3
                # Direct gets may be answered by a replica that lags: a claimer deciding
                # on such reads could be refused against tickets long released (and a
                # release could miss its ticket). Reads go through the stream leader.
                assert not stream.config.allow_direct
            usable = 6 * GIB
            state = ProviderState(provider=PROVIDER, endpoint="http://gpu-a:11434", ready=True,
                                  total_vram_mib=usable + 1024, reserve_mib=1024)
            states = await kv.bucket(states_name)
            await until_served(lambda: states.put(encode_token(PROVIDER), state.to_json()))
            tickets = await kv.bucket(tickets_name)  # its stream has a leader: it answers
            await until_served(lambda: tickets.get(encode_token(PROVIDER)))
            # Each claimer connects to a server of the list picked at random (nats-py's
            # default); the killed one is the first, so some of them talk to it.
            urls = ",".join(cluster.urls)
            logs = [Path(cluster.dir) / f"claimer{seed}.log" for seed in range(3)]
            for seed, log in enumerate(logs):
                with log.open("wb") as stderr:
                    processes.append(await asyncio.create_subprocess_exec(
                        sys.executable, CLAIMER, urls, tickets_name, states_name, str(seed),
                        str(ROUNDS_AFTER_KILL), str(2 * GIB), str(3 * GIB),
                        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                        stderr=stderr, cwd=ROOT, preexec_fn=die_with_the_test,
                    ))
            for process, log in zip(processes, logs, strict=True):  # each granted something
                assert process.stdout is not None
                try:
                    line = await asyncio.wait_for(process.stdout.readline(), GRANT_DEADLINE)
                except TimeoutError:
                    pytest.fail(await stall_report(
                        f"a claimer got no grant within {GRANT_DEADLINE:.0f} s (before any "
                        "server was killed)", kv, cluster, tickets_name, states_name, logs))
                assert line.strip() == b"running", log.read_text()
            killed_at = time.time()
            cluster.kill(0)  # while every claimer claims: none has been told to finish
            for process in processes:
                assert process.stdin is not None
                # one that died already is reported below, with its exit status and log
                with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                    process.stdin.write(b"killed\n")
                    await process.stdin.drain()
            try:
                outputs = await asyncio.wait_for(
                    asyncio.gather(*(p.communicate() for p in processes)), FINISH_DEADLINE)
            except TimeoutError:
                pytest.fail(await stall_report(
                    f"the claimers did not finish within {FINISH_DEADLINE:.0f} s of the kill",
                    kv, cluster, tickets_name, states_name, logs))
            assert [p.returncode for p in processes] == [0, 0, 0], [
                log.read_text() for log in logs]
            intervals: list[tuple[float, float, int]] = []
            for (out, _), log in zip(outputs, logs, strict=True):
                mine = [(g, r, f) for g, r, f in json.loads(out)["intervals"]]
                after = [i for i in mine if i[0] > killed_at]
                # each of its two tasks was granted its rounds after the kill
                assert len(after) >= 2 * ROUNDS_AFTER_KILL, log.read_text()
                intervals += mine
            assert overcommits(intervals, usable) == 0
        finally:
            for process in processes:  # a failed run leaves no claimer behind
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            await kv.close()
        # A fresh client through the survivors sees no ticket left behind.
        reader = await connected(cluster, replicas=1)
        try:
            tickets = await until_served(lambda: reader.bucket(tickets_name))
            states_bucket = await until_served(lambda: reader.bucket(states_name))
            manager = TicketManager(tickets, states_bucket, clock=SystemClock())
            assert await until_served(lambda: manager.active(PROVIDER)) == []
        finally:
            await reader.close()


@pytest.mark.nats
@pytest.mark.slow
async def test_the_operator_raises_buckets_an_agent_created_to_three_copies() -> None:
    """An agent (no ``KUBEMOOT_NATS_REPLICAS``) starts first and creates the buckets."""
    async with three_node_cluster() as cluster:
        agent = await connected(cluster, replicas=1)
        operator = await connected(cluster, replicas=3)
        try:
            tickets = await until_served(lambda: agent.bucket(PROVIDER_TICKETS_BUCKET))
            await until_served(lambda: tickets.put("k", b"before"))
            first = await agent._js.stream_info(f"KV_{PROVIDER_TICKETS_BUCKET}")
            assert (first.config.num_replicas, first.config.allow_direct) == (1, True)

            await until_served(lambda: open_shared_buckets(operator))
            for name in (PROVIDER_STATE_BUCKET, PROVIDER_TICKETS_BUCKET, MODEL_DEMAND_BUCKET):
                stream = await operator._js.stream_info(f"KV_{name}")
                assert (stream.config.num_replicas, stream.config.allow_direct) == (3, False)

            # The agent's bucket was opened for direct gets, which nobody answers now:
            # it reads on through the leader and sees what the operator's side wrote.
            operator_tickets = await operator.bucket(PROVIDER_TICKETS_BUCKET)
            await until_served(lambda: operator_tickets.put("k", b"after"))
            entry = await until_served(lambda: tickets.get("k"))
            assert entry is not None and entry.value == b"after"
            # and an agent never lowers the count again
            await until_served(lambda: agent.bucket(MODEL_DEMAND_BUCKET))
            fresh = await connected(cluster, replicas=1)
            try:
                await until_served(lambda: fresh.bucket(PROVIDER_TICKETS_BUCKET))
            finally:
                await fresh.close()
            stream = await operator._js.stream_info(f"KV_{PROVIDER_TICKETS_BUCKET}")
            assert stream.config.num_replicas == 3
        finally:
            await agent.close()
            await operator.close()
