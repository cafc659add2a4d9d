"""The cluster path end to end, as a user walks it (docs/operator.md).

kmock stands in for the Kubernetes API, the operator runs against it and publishes the
providers' state to a real ``nats-server``; two Ollama-API emulators are the GPUs. The
crew is the one shipped in ``deploy/crew`` (Agents, policy and one Deployment per
Agent). Each Agent then runs as a real ``kubemoot agent`` process started with the env
read back from the Deployment the operator patched, and ``kubemoot ask`` asks the crew.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kubemoot.agent.process import ENV_AGENT_NAME
from kubemoot.cli.agent import READY_LINE
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.operator.kube import KubeClient
from kubemoot.operator.reconciler import Reconciler
from kubemoot.operator.run import kopf_settings, serve
from kubemoot.settings import NatsSettings
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    ProviderTickets,
    Ticket,
)
from kubemoot.store.nats import NatsKV
from kubemoot.store.protocol import Bucket
from kubemoot.testing.emulators import emulator_factory
from kubemoot.testing.nats_server import NatsServer, running_nats_server
from kubemoot.testing.waiting import until_stored
from tests.operator.conftest import (
    Cluster,
    OperatorThread,
    _watches_open,
    declare_resources,
    eventually,
    settle,
)

pytestmark = pytest.mark.nats

ROOT = Path(__file__).resolve().parents[2]
KUBEMOOT = Path(sys.executable).with_name("kubemoot")
NS, CREW = "crew-homelab-pilot", "homelab-pilot"
AGENTS = ("coordinator", "kubectl-agent", "log-analyst")
PHI3 = EmulatedModel("phi3:mini", 2048)
QWEN3 = EmulatedModel("qwen3:8b", 5120)
#: 7400 MiB less the 1024 MiB reserve holds qwen3:8b or phi3:mini, never both (the
#: agents estimate a model never seen loaded by its size on disk plus its KV cache).
CARD: dict[str, object] = {
    "models": (PHI3, QWEN3), "vram_mib": 7400, "num_parallel": 2, "context_length": 4096,
    "load_rate_mibps": 100000.0, "base_latency_s": 0.5, "per_token_s": 0.0,
    "time_scale": 0.01, "keep_alive_s": 30_000.0,
}
#: The runtime's settings for fast cards, as a Deployment would set them in KUBEMOOT_*.
FAST_ENV = {
    "KUBEMOOT_LOAD_RATE_MIBPS": "100000", "KUBEMOOT_UNLOAD_SECONDS": "0.01",
    "KUBEMOOT_DEFAULT_LATENCY_SECONDS": "5", "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS": "20",
    "KUBEMOOT_CREW_ROLL_CALL_SECONDS": "0.5", "KUBEMOOT_CREW_HEARTBEAT_SECONDS": "0.5",
    "KUBEMOOT_CREW_SILENCE_SECONDS": "3", "KUBEMOOT_TICKET_TTL_SECONDS": "60",
}
QUESTION = "Pods in the payments namespace restart every few minutes; what is wrong?"


def manifests(relative: str) -> list[dict[str, Any]]:
    text = (ROOT / relative).read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc]


class NatsOperator(OperatorThread):
    """The operator of tests/operator, publishing the providers' state to NATS."""

    def __init__(self, server_url: str, nats_url: str) -> None:
        super().__init__(server_url)
        self.nats_url = nats_url

    async def _main(self) -> None:
        clock = SystemClock()
        store = await NatsKV.connect(NatsSettings(servers=[self.nats_url]))
        self.bucket = await store.bucket(PROVIDER_STATE_BUCKET)
        self.reconciler = Reconciler(KubeClient(self._login), clock=clock, bucket=self.bucket,
                                     probe_interval=3600.0, probe_timeout=5.0)
        self._stop = asyncio.Event()
        self._started.set()
        try:
            settings = kopf_settings()
            settings.queueing.idle_timeout = 0.2
            await serve(self.reconciler, login=self._login, stop=self._stop, settings=settings)
        finally:
            await store.close()


def provider(name: str, emulator: OllamaEmulator) -> dict[str, Any]:
    return {
        "apiVersion": "kubemoot.ai/v1alpha1", "kind": "ModelProvider",
        "metadata": {"name": name, "annotations": {"kubemoot.ai/vram-total-mib": "7400"}},
        "spec": {"type": "ollama", "endpoint": emulator.url, "numParallel": 2,
                 "contextLength": 4096},
    }


def model(name: str, model_id: str, provider_name: str, vram: int,
          labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "kubemoot.ai/v1alpha1", "kind": "Model",
        "metadata": {"name": name, "labels": {"capability/tool-calling": "true", **labels}},
        "spec": {"model": model_id, "providerRef": provider_name, "vramMib": vram},
    }


def container_env(cluster: Cluster, name: str) -> dict[str, str]:
    """The agent container's env as a pod would see it (the downward API resolved)."""
    deployment = cluster.deployment(NS, name)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    agent = next(c for c in containers if c["name"] == "agent")
    env: dict[str, str] = {}
    for item in agent.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == \
                "metadata.namespace":
            env[item["name"]] = NS
    return env


async def post(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
    response = await http.post(path, json=body)
    assert response.status_code < 300, response.text


async def apply_crew(cluster: Cluster, gpus: dict[str, OllamaEmulator]) -> None:
    """What `kubectl apply -k deploy/overlays/…` does, with our emulators as providers."""
    for doc in manifests("deploy/base/archetype-consent-3.yaml"):
        await cluster.apply(doc)
    for name, emulator in gpus.items():
        await cluster.apply(provider(name, emulator))
        await cluster.apply(model(f"phi3-mini-{name}", "phi3:mini", name, 2048,
                                  {"family": "phi3", "params": "3.8B", "latencyClass": "low"}))
        await cluster.apply(model(f"qwen3-8b-{name}", "qwen3:8b", name, 5120,
                                  {"family": "qwen3", "params": "8B",
                                   "capability/reasoning": "true"}))
    for doc in manifests("deploy/crew/deployments.yaml"):
        await post(cluster.http, f"/apis/apps/v1/namespaces/{NS}/deployments", doc)
    for doc in manifests("deploy/crew/policy.yaml") + manifests("deploy/crew/agents.yaml"):
        await cluster.apply(doc)


class AgentProcess:
    """One `kubemoot agent` with the env of its Deployment."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []

    @classmethod
    async def start(cls, env: dict[str, str]) -> AgentProcess:
        process = await asyncio.create_subprocess_exec(
            str(KUBEMOOT), "agent", env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        return cls(process)

    async def ready(self) -> None:
        """Wait for the process's ready line (it has joined its crew)."""
        await self.until_line(lambda line: READY_LINE in line)

    async def until_line(self, wanted: Callable[[str], bool], timeout: float = 60.0) -> str:
        """Read the process's lines until one is ``wanted`` (or seen already); return it."""
        assert self.process.stderr is not None
        for line in self.lines:
            if wanted(line):
                return line
        while True:
            raw = await asyncio.wait_for(self.process.stderr.readline(), timeout)
            if not raw:
                raise AssertionError("kubemoot agent exited:\n" + "".join(self.lines))
            self.lines.append(raw.decode())
            if wanted(self.lines[-1]):
                return self.lines[-1]

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        assert self.process.stderr is not None
        rest = await asyncio.wait_for(self.process.stderr.read(), 60.0)
        self.lines.append(rest.decode())
        return await asyncio.wait_for(self.process.wait(), 60.0)


@pytest.fixture
async def nats_url() -> AsyncIterator[str]:
    async with running_nats_server() as server:
        assert isinstance(server, NatsServer)
        yield server.url


def mount_prompts(directory: Path) -> Path:
    """What the kubelet does with the crew's prompts ConfigMap volume: a file per key."""
    (config_map,) = manifests("deploy/crew/prompts.yaml")
    for key, text in config_map["data"].items():
        (directory / key).write_text(text, encoding="utf-8")
    return directory


class ClusterPath:
    """The operator on kmock, two emulated GPUs, and the crew's agent processes."""

    def __init__(self, cluster: Cluster, gpus: dict[str, OllamaEmulator], nats_url: str,
                 prompts: Path):
        self.cluster = cluster
        self.gpus = gpus
        self.nats_url = nats_url
        self.base = {k: v for k, v in os.environ.items() if not k.startswith("KUBEMOOT_")}
        self.agents: dict[str, AgentProcess] = {}
        self.codes: dict[str, int] = {}
        self.prompts = prompts

    async def bound(self) -> None:
        """Wait until every Agent is bound, its Deployment carries the binding, and the
        operator is idle with both providers probed.

        kopf's watches deliver the kinds in no fixed order: an Agent seen before the last
        Model or a provider's first probe is bound, then bound again when those arrive (an
        input changed, DESIGN §4). A test that read the env before that read a binding
        about to change (one CI run in ten).
        """

        def probed() -> bool:
            return all(self.cluster.condition("ModelProvider", name, "Ready").get("status")
                       == "True" for name in self.gpus)

        await eventually(probed, what="both providers probed ready")
        await settle(self.cluster)
        for name in AGENTS:
            await eventually(
                lambda name=name: "KUBEMOOT_TRIAGE_MODEL_MODEL_ID" in container_env(
                    self.cluster, name) and "KUBEMOOT_MODEL_MODEL" in container_env(
                    self.cluster, name), what=f"{name}'s Deployment patched")

    async def start(self, name: str) -> AgentProcess:
        """`kubemoot agent` with the env of the Deployment the operator patched."""
        env = container_env(self.cluster, name)
        assert env[ENV_AGENT_NAME] == name
        listed = {c["model"] for c in json.loads(env["KUBEMOOT_MODEL_CANDIDATES_MULLING"])}
        assert listed
        # The Models' vramMib travel with the binding, for the agent's cold loads.
        sizes = json.loads(env["KUBEMOOT_MODEL_SIZES_MIB"])
        assert listed <= set(sizes) and sizes.items() <= {"phi3:mini": 2048,
                                                         "qwen3:8b": 5120}.items()
        env["KUBEMOOT_NATS_URL"] = self.nats_url  # the Service, as seen from outside
        env["KUBEMOOT_PROMPTS_DIR"] = str(self.prompts)  # the ConfigMap volume's mount
        agent = await AgentProcess.start({**self.base, **env, **FAST_ENV})
        self.agents[name] = agent
        await agent.ready()
        return agent

    async def ask(self) -> dict[str, Any]:
        asked = await asyncio.create_subprocess_exec(
            str(KUBEMOOT), "ask", "--crew", f"{NS}/{CREW}", "--nats", self.nats_url,
            "-o", "json", QUESTION, env={**self.base, **FAST_ENV},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(asked.communicate(), 90.0)
        assert asked.returncode == 0, err.decode() + out.decode()
        answer: dict[str, Any] = json.loads(out)
        return answer

    async def stop_all(self) -> None:
        for name, agent in self.agents.items():
            self.codes[name] = await agent.stop()


@asynccontextmanager
async def cluster_path(kmock: Any, nats_url: str) -> AsyncIterator[ClusterPath]:
    with tempfile.TemporaryDirectory() as prompts:
        async with _cluster_path(kmock, nats_url, mount_prompts(Path(prompts))) as path:
            yield path


@asynccontextmanager
async def _cluster_path(kmock: Any, nats_url: str, prompts: Path
                        ) -> AsyncIterator[ClusterPath]:
    declare_resources(kmock)
    url = str(kmock.url).rstrip("/")
    operator = NatsOperator(url, nats_url)
    operator.start()
    with emulator_factory(CARD) as make:
        gpus = {"gpu-a": make(), "gpu-b": make()}
        path: ClusterPath | None = None
        try:
            await _watches_open(kmock)
            assert operator.reconciler is not None and operator.bucket is not None
            async with httpx.AsyncClient(base_url=url) as http:
                cluster = Cluster(kmock, http, operator.reconciler, operator.bucket, operator)
                await apply_crew(cluster, gpus)
                path = ClusterPath(cluster, gpus, nats_url, prompts)
                await path.bound()
                yield path
        finally:
            if path is not None:
                await path.stop_all()
            await operator.stop()


async def test_a_crew_of_agent_processes_answers_through_the_cluster_path(
    kmock: Any, nats_url: str,
) -> None:
    async with cluster_path(kmock, nats_url) as path:
        await asyncio.gather(*(path.start(name) for name in AGENTS))
        answer = await path.ask()
    evictions = {name: gpu.engine.evictions for name, gpu in path.gpus.items()}

    assert answer["answered"] is True and answer["settlement"] == "synthesis"
    assert answer["crew"] == f"{NS}/{CREW}"
    assert sorted(answer["selected"]) == [f"{NS}/kubectl-agent", f"{NS}/log-analyst"]
    calls = answer["calls"]
    assert {c["provider"] for c in calls} == {"gpu-a", "gpu-b"}, json.dumps(answer, indent=1)
    phases = {(c["agent"].split("/")[1], c["phase"]) for c in calls}
    assert {("kubectl-agent", "mulling"), ("log-analyst", "mulling"),
            ("coordinator", "synthesis")} <= phases
    for call in calls:
        assert call["ok"] and call["model"] in ("phi3:mini", "qwen3:8b")
        assert call["action"] in ("warm", "queue", "loading", "cold-load", "unload")
        assert isinstance(call["evicted"], list)
    # every eviction was the scheduler's; a failure tells each card's story and the calls
    assert evictions == {"gpu-a": [], "gpu-b": []}, "\n".join(
        [f"{name}:\n{gpu.engine.story()}" for name, gpu in path.gpus.items()]
        + [json.dumps(calls, indent=1)])
    # SIGTERM: each agent shut down cleanly (128 + SIGTERM) ...
    assert set(path.codes.values()) == {128 + signal.SIGTERM}, path.codes
    # ... and left no ticket behind in the shared state.
    assert await _tickets(nats_url) == []


async def test_an_agent_process_killed_mid_discussion_costs_its_tickets_ttl_only(
    kmock: Any, nats_url: str,
) -> None:
    async with cluster_path(kmock, nats_url) as path:
        await asyncio.gather(*(path.start(name) for name in AGENTS))
        # Every chat takes a second from now on: the discussion is in full swing
        # while the victim's calls are in flight.
        for gpu in path.gpus.values():
            gpu.stall_next(1.0, path="/api/chat", count=50)
        asking = asyncio.ensure_future(path.ask())
        victim = "kubectl-agent"

        def victim_holds(tickets: list[Ticket]) -> bool:
            return any(f"/{victim}@" in t.holder_id for t in tickets)

        process = path.agents[victim].process
        while True:
            await _until_tickets(nats_url, victim_holds, what="the victim holding a ticket")
            # Frozen, the victim cannot release between the look and the kill: on a
            # loaded machine the watch can report a ticket after its 1 s call ended.
            process.send_signal(signal.SIGSTOP)
            if victim_holds(await _tickets(nats_url)):
                break
            process.send_signal(signal.SIGCONT)
        killed_at = time.time()
        process.kill()  # SIGKILL: no goodbye, tickets left behind
        first = await asking
        left = [t for t in await _tickets(nats_url) if f"/{victim}@" in t.holder_id]

        # The same Deployment's pod comes back: the crew answers with it again.
        await path.agents.pop(victim).stop()
        await path.start(victim)
        for gpu in path.gpus.values():
            gpu.clear_faults()
        second = await path.ask()

    # The discussion did not hang on the dead process: its silence was a failure ...
    (dead,) = [s for s in first["signals"] if s["agent"] == f"{NS}/{victim}"
               and s["type"] == "failure"]
    assert "no word from the agent's process" in dead["metadata"]["lastError"]
    # ... and the other member's position still made the crew's answer.
    assert first["answered"] is True, first
    # What the dead process held is reclaimed by the TTL, never later.
    ttl = float(FAST_ENV["KUBEMOOT_TICKET_TTL_SECONDS"])
    assert left, "the killed process left its tickets"
    assert all(t.expires_at <= killed_at + ttl for t in left), left
    assert second["answered"] is True, second
    assert sorted(second["selected"]) == [f"{NS}/kubectl-agent", f"{NS}/log-analyst"]
    assert {s["agent"] for s in second["signals"] if s["type"] in ("agree", "concern")} == {
        f"{NS}/kubectl-agent", f"{NS}/log-analyst"}


async def _read_tickets(bucket: Bucket) -> list[Ticket]:
    found: list[Ticket] = []
    for key in await bucket.keys():
        entry = await bucket.get(key)
        if entry is not None:
            found += ProviderTickets.from_json(entry.value).tickets
    return found


async def _tickets(nats_url: str) -> list[Ticket]:
    """Every ticket in the shared state, expired or not."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        return await _read_tickets(await kv.bucket(PROVIDER_TICKETS_BUCKET))
    finally:
        await kv.close()


async def _until_tickets(nats_url: str, check: Callable[[list[Ticket]], bool], *,
                         what: str) -> None:
    """Wait, on a watch of the shared tickets the agent processes write, until ``check``
    holds for them."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket(PROVIDER_TICKETS_BUCKET)

        async def reached() -> bool:
            return check(await _read_tickets(bucket))

        await until_stored(bucket, reached, timeout=30, what=what)
    finally:
        await kv.close()
