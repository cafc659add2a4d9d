"""The prod overlay's shared state: a three-node JetStream cluster, buckets replicated 3×.

Opt-in: set ``KUBEMOOT_NATS_CLUSTER_TEST=1``. It was seen once, on a heavily loaded
machine, in about one run of three: one claimer process got no grant for a minute
although the ticket document's tickets were empty, before any server was killed. Not
reproduced since (0 in over 100 runs, with two runs pinned to one core among them); the
cause is unknown. Should it happen again the failure names each claimer's server, every
reason it was refused, and the ticket document (with its ``line``) and provider state.

Three ``nats-server`` processes on loopback form one cluster; claimer processes claim
and release VRAM tickets through it; one server is SIGKILLed while they run. Claims go
on through the other two, no ticket is lost or leaked, and the budget is never
overcommitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
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
from kubemoot.runtime.tickets import TicketManager
from kubemoot.store.documents import ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV, NatsSettings
from kubemoot.store.protocol import StoreError
from kubemoot.testing.nats_server import find_nats_server, free_port

CLAIMER = str(Path(__file__).with_name("_cluster_claimer.py"))
ROOT = str(Path(__file__).resolve().parents[2])
GIB = 1024
PROVIDER = "gpu-a"
READY_DEADLINE = 60.0  # seconds for the cluster to elect a JetStream leader
T = TypeVar("T")


class Cluster:
    """Three clustered JetStream servers on loopback."""

    def __init__(self) -> None:
        ports = distinct_ports(6)
        self.ports, self.routes = ports[:3], ports[3:]
        self.dir = tempfile.mkdtemp(prefix="nats-cluster-")
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.ports]

    def start(self) -> None:
        routes = ",".join(f"nats://127.0.0.1:{port}" for port in self.routes)
        for index, (port, route) in enumerate(zip(self.ports, self.routes, strict=True)):
            store = Path(self.dir) / f"n{index}"
            store.mkdir()
            log = (store / "server.log").open("ab")
            self.processes.append(subprocess.Popen(
                [find_nats_server(), "-js", "-a", "127.0.0.1", "-p", str(port),
                 "-sd", str(store), "--server_name", f"n{index}",
                 "--cluster_name", "kubemoot", "--cluster", f"nats://127.0.0.1:{route}",
                 "--routes", routes],
                stdout=log, stderr=subprocess.STDOUT,
            ))

    def kill(self, index: int) -> None:
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait()

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
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
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def replicated_buckets(cluster: Cluster) -> tuple[NatsKV, str, str]:
    """Connect and create both buckets with 3 replicas once the cluster has a leader."""
    loop = asyncio.get_running_loop()
    end = loop.time() + READY_DEADLINE
    last: Exception | None = None
    while loop.time() < end:
        try:
            kv = await NatsKV.connect(NatsSettings(servers=cluster.urls, replicas=3,
                                                   max_reconnect_attempts=5))
        except StoreError as error:
            last = error
            await asyncio.sleep(0.2)
            continue
        try:
            tickets = await kv.bucket("tickets")
            states = await kv.bucket("states")
            return kv, tickets.name, states.name
        except StoreError as error:  # no JetStream leader yet
            last = error
            await kv.close()
            await asyncio.sleep(0.2)
    raise AssertionError(f"the cluster never served JetStream: {last!r}")


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


async def stall_report(kv: NatsKV, cluster: Cluster, tickets_name: str, states_name: str,
                       logs: list[Path]) -> str:
    """What a claimer that got no grant saw, and the documents it decided on."""
    key = encode_token(PROVIDER)
    lines = ["a claimer got no grant within 60 s (before any server was killed)",
             f"this cluster's servers: {', '.join(cluster.urls)}"]
    for name in (tickets_name, states_name):
        try:
            entry = await (await kv.bucket(name)).get(key)
            lines.append(f"{name}/{key}: {entry.value.decode() if entry else None}")
        except StoreError as error:
            lines.append(f"{name}/{key}: unreadable: {error}")
    lines += [f"--- {log.name}\n{log.read_text()}" for log in logs]
    return "\n".join(lines)


def overcommits(intervals: list[tuple[float, float, int]], usable: int) -> int:
    count = 0
    for granted, _released, _ in intervals:
        held = sum(f for g, r, f in intervals if g <= granted < r)
        count += held > usable
    return count


@pytest.mark.nats
@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("KUBEMOOT_NATS_CLUSTER_TEST") != "1",
    reason="opt-in (KUBEMOOT_NATS_CLUSTER_TEST=1): a claimer once stalled before the "
    "kill, cause unknown (see docs/operator.md)",
)
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
                        "12", str(2 * GIB), str(3 * GIB), stdout=asyncio.subprocess.PIPE,
                        stderr=stderr, cwd=ROOT,
                    ))
            for process, log in zip(processes, logs, strict=True):  # each granted something
                assert process.stdout is not None
                try:
                    line = await asyncio.wait_for(process.stdout.readline(), 60)
                except TimeoutError:
                    pytest.fail(await stall_report(kv, cluster, tickets_name, states_name, logs))
                assert line.strip() == b"running", log.read_text()
            killed_at = time.time()
            cluster.kill(0)
            outputs = await asyncio.wait_for(
                asyncio.gather(*(p.communicate() for p in processes)), 180)
            assert all(p.returncode == 0 for p in processes)
            intervals = [tuple(i) for out, _ in outputs for i in json.loads(out)["intervals"]]
            assert len(intervals) == 3 * 2 * 12  # every claim of every round was granted
            assert any(granted > killed_at for granted, _, _ in intervals)
            assert overcommits(intervals, usable) == 0  # type: ignore[arg-type]
        finally:
            for process in processes:  # a failed run leaves no claimer behind
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            await kv.close()
        # A fresh client through the survivors sees no ticket left behind.
        reader = await NatsKV.connect(NatsSettings(servers=cluster.urls[1:]))
        try:
            tickets = await until_served(lambda: reader.bucket(tickets_name))
            states_bucket = await until_served(lambda: reader.bucket(states_name))
            manager = TicketManager(tickets, states_bucket, clock=SystemClock())
            assert await until_served(lambda: manager.active(PROVIDER)) == []
        finally:
            await reader.close()
