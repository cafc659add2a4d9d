"""The agent side of the cluster path, end to end with real ``kubemoot agent`` processes.

As in :mod:`tests.crew.test_cluster_e2e`: kmock is the Kubernetes API, the operator runs
against it and publishes to a real ``nats-server``, two Ollama-API emulators are the
GPUs, and each Agent of ``deploy/crew`` runs as a ``kubemoot agent`` process with the
env of the Deployment the operator patched (and the crew's prompts ConfigMap mounted).
Here: every process writes its calls, with their decisions, to the call log; the
Agents' enabledTools and promptRefs reach the model; and agents that start while the
shared state holds no provider probe their endpoints directly, wait, and follow the
operator's state once it is published; and a process whose mulling phase the operator
left unschedulable (the env docs/operator.md describes) makes no call and stands aside
with the reason.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
import yaml

from kubemoot.agent.direct import DIRECT_PREFIX, direct_name
from kubemoot.cli.agent import STATIC_LINE
from kubemoot.dashboard.calllog import CALL_LOG_BUCKET, CallEntry
from kubemoot.settings import NatsSettings
from kubemoot.store.documents import MODEL_DEMAND_BUCKET, PROVIDER_STATE_BUCKET, ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.nats import NatsKV
from kubemoot.testing.waiting import until_stored

from .test_cluster_e2e import (
    AGENTS,
    CREW,
    FAST_ENV,
    KUBEMOOT,
    NS,
    ROOT,
    AgentProcess,
    ClusterPath,
    cluster_path,
    container_env,
    nats_url,  # noqa: F401  (the fixture)
)

pytestmark = pytest.mark.nats

TOOLS_QUESTION = ("Checkout pods restart every few minutes; use kubectl_get and loki_query "
                  "and say why.")


async def ask(path: ClusterPath, question: str) -> dict[str, Any]:
    """``kubemoot ask -o json`` from outside the cluster."""
    asked = await asyncio.create_subprocess_exec(
        str(KUBEMOOT), "ask", "--crew", f"{NS}/{CREW}", "--nats", path.nats_url, "-o", "json",
        question, env={**path.base, **FAST_ENV},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(asked.communicate(), 90.0)
    assert asked.returncode == 0, err.decode() + out.decode()
    answer: dict[str, Any] = json.loads(out)
    return answer


async def start(path: ClusterPath, name: str, **extra: str) -> AgentProcess:
    """:meth:`ClusterPath.start` with more ``KUBEMOOT_*`` settings in the pod's env."""
    env = {**container_env(path.cluster, name), "KUBEMOOT_NATS_URL": path.nats_url,
           "KUBEMOOT_PROMPTS_DIR": str(path.prompts)}
    agent = await AgentProcess.start({**path.base, **env, **FAST_ENV, **extra})
    path.agents[name] = agent
    await agent.ready()
    return agent


async def call_log(url: str) -> list[CallEntry]:
    kv = await NatsKV.connect(NatsSettings(servers=[url]))
    try:
        bucket = await kv.bucket(CALL_LOG_BUCKET)
        return [CallEntry.from_json(entry.value) for key in await bucket.keys()
                if (entry := await bucket.get(key)) is not None]
    finally:
        await kv.close()


def system_prompt(agent: str) -> str:
    """The system prompt the Agent's promptRefs make of deploy/crew's ConfigMap."""
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(
        (ROOT / "deploy/crew/agents.yaml").read_text(encoding="utf-8")) if d}
    data = next(d for d in yaml.safe_load_all(
        (ROOT / "deploy/crew/prompts.yaml").read_text(encoding="utf-8")) if d)["data"]
    return "\n\n".join(data[ref].strip() for ref in docs[agent]["spec"]["promptRefs"])


async def test_agent_processes_log_their_calls_and_work_with_their_tools_and_prompts(
    kmock: Any, nats_url: str,  # noqa: F811
) -> None:
    async with cluster_path(kmock, nats_url) as path:
        envs = {name: container_env(path.cluster, name) for name in AGENTS}
        await asyncio.gather(*(path.start(name) for name in AGENTS))
        answer = await ask(path, TOOLS_QUESTION)
        await path.stop_all()  # SIGTERM: each process writes its last entries, then exits
        entries = await call_log(nats_url)
        records = [r for gpu in path.gpus.values() for r in gpu.records]

    assert answer["answered"] is True, answer
    calls = answer["calls"]
    # The operator templated the Agents' spec for the processes ...
    assert json.loads(envs["kubectl-agent"]["KUBEMOOT_AGENT_ENABLED_TOOLS"]) == [
        "kubectl_get", "kubectl_describe", "kubectl_logs"]
    assert json.loads(envs["coordinator"]["KUBEMOOT_AGENT_ENABLED_TOOLS"]) == []
    assert json.loads(envs["log-analyst"]["KUBEMOOT_AGENT_PROMPT_REFS"])[-1] == \
        "log-analyst-system"
    # ... each member called its tool, then answered (two engine requests for one call)
    mulling = {c["agent"].split("/")[1]: c for c in calls if c["phase"] == "mulling"}
    assert set(mulling) == {"kubectl-agent", "log-analyst"}
    assert all(c["ok"] and c["modelCalls"] == 2 for c in mulling.values()), mulling
    with_tools = [r for r in records if r.path == "/api/chat" and r.tools]
    for agent, tool in (("kubectl-agent", "kubectl_get"), ("log-analyst", "loki_query")):
        mine = [r for r in with_tools if r.messages[0]["content"] == system_prompt(agent)]
        assert mine, f"no request of {agent} carried its promptRefs as system prompt"
        answered = [r for r in mine if r.messages[-1].get("role") == "tool"]
        assert answered and answered[0].messages[-1]["tool_name"] == tool
    # Every call carries its decision: the options priced in seconds, the action, victims.
    for call in calls:
        decision = call["decision"]
        assert decision["action"] == call["action"] and decision["victims"] == call["evicted"]
        assert decision["options"] and decision["chosen"], call
    # Every process logged its own calls: the call log holds exactly the crew's calls.
    assert Counter((e.agent, e.phase, e.provider, e.action, e.ok) for e in entries) == Counter(
        (c["agent"], c["phase"], c["provider"], c["action"], c["ok"]) for c in calls)
    assert {e.agent for e in entries} == {f"{NS}/{name}" for name in AGENTS}
    for entry in entries:
        assert entry.decision is not None and entry.decision["options"], entry


async def test_agents_started_without_provider_state_probe_directly_then_follow_the_operator(
    kmock: Any, nats_url: str,  # noqa: F811
) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        states = await kv.bucket(PROVIDER_STATE_BUCKET)
        demand = await kv.bucket(MODEL_DEMAND_BUCKET)
        async with cluster_path(kmock, nats_url) as path:
            # NATS lost its buckets (a restart without persistence) and the operator has
            # not probed since: the agents start with bindings and no provider state.
            for key in await states.keys():
                await states.delete(key)
            endpoints = {e for name in AGENTS for variable in (
                "KUBEMOOT_MODEL_ENDPOINT", "KUBEMOOT_TRIAGE_MODEL_ENDPOINT")
                if (e := container_env(path.cluster, name).get(variable))}
            await asyncio.gather(*(start(path, name, KUBEMOOT_DISCOVERY_SECONDS="0.3")
                                   for name in AGENTS))

            async def probed_directly() -> set[str]:
                found = set()
                for key in await states.keys():
                    entry = await states.get(key)
                    if entry is not None:
                        state = ProviderState.from_json(entry.value)
                        if state.ready and state.provider.startswith(DIRECT_PREFIX):
                            found.add(state.endpoint)
                return found

            seen = await until_stored(states, probed_directly, timeout=30,
                                      what="the bound endpoints probed directly")
            asking = asyncio.ensure_future(ask(path, "Checkout pods restart; why?"))

            async def waiting() -> bool:  # both members wait for a GPU (the demand board)
                agents = {k.split(".")[2] for k in await demand.keys() if k.startswith("wait.")}
                return len(agents) >= 2  # keys are wait.<model>.<agent>

            await until_stored(demand, waiting, timeout=30, what="both members waiting")
            # The operator's first probe: the state returns, the waiters wake.
            await path.cluster.operator.call(path.cluster.reconciler.probe_all)
            answer = await asking

            async def withdrawn() -> bool:
                return not any(k.startswith(encode_token(DIRECT_PREFIX)) for k in
                               await states.keys())

            await until_stored(states, withdrawn, timeout=30, what="direct state withdrawn")
            for agent in path.agents.values():  # each reads the operator's state in its tick
                await agent.until_line(lambda line: STATIC_LINE in line and any(
                    f"on {gpu}" in line for gpu in path.gpus))
            await path.stop_all()
            lines = {name: "".join(agent.lines) for name, agent in path.agents.items()}
    finally:
        await kv.close()

    assert seen == endpoints
    # Nothing could be loaded on a card of unknown size: the members waited, and the
    # operator's state let them place where it said.
    assert answer["answered"] is True, answer
    mulling = [c for c in answer["calls"] if c["phase"] == "mulling"]
    assert len(mulling) == 2 and all(c["ok"] for c in mulling), answer["calls"]
    assert {c["provider"] for c in answer["calls"]} <= set(path.gpus), answer["calls"]
    assert all(c["waitedSeconds"] > 0 for c in mulling), mulling
    # Each agent's static targets moved from the direct probe to the operator's names.
    for name, text in lines.items():
        shown = [line for line in text.splitlines() if STATIC_LINE in line]
        env = container_env(path.cluster, name)
        # (the first line may come before the direct probe is stored: then it names the URL)
        assert any(direct_name(env["KUBEMOOT_MODEL_ENDPOINT"]) in line for line in shown), (
            name, shown)
        assert any(f"on {gpu}" in shown[-1] for gpu in path.gpus), (name, shown)


async def test_an_agent_process_whose_mulling_is_unschedulable_stands_aside_with_the_reason(
    kmock: Any, nats_url: str,  # noqa: F811
) -> None:
    reason = ("0/4 models are available for phase mulling: 4 didn't match require "
              "selector.")
    async with cluster_path(kmock, nats_url) as path:
        await asyncio.gather(*(path.start(name) for name in ("coordinator", "log-analyst")))
        # The Deployment as the operator leaves it while kubectl-agent's mulling is
        # UNSCHEDULABLE (docs/operator.md): the phase's binding gone, its reason set.
        env = {k: v for k, v in container_env(path.cluster, "kubectl-agent").items()
               if k not in ("KUBEMOOT_MODEL_MODEL", "KUBEMOOT_MODEL_ENDPOINT",
                            "KUBEMOOT_MODEL_CANDIDATES_MULLING")}
        agent = await AgentProcess.start({
            **path.base, **env, **FAST_ENV, "KUBEMOOT_MODEL_UNSCHEDULABLE_REASON": reason,
            "KUBEMOOT_NATS_URL": path.nats_url, "KUBEMOOT_PROMPTS_DIR": str(path.prompts)})
        path.agents["kubectl-agent"] = agent
        await agent.ready()
        answer = await ask(path, TOOLS_QUESTION)
        await path.stop_all()
        entries = await call_log(nats_url)

    me = f"{NS}/kubectl-agent"
    assert f"mulling unschedulable ({reason})" in "".join(agent.lines)
    (aside,) = [s for s in answer["signals"] if s["agent"] == me]
    assert aside["type"] == "stand_aside" and aside["content"] == reason
    assert aside["metadata"]["reason"] == "unschedulable"
    # it made no call at all (its triage is bound, but it never got that far) ...
    assert [c for c in answer["calls"] if c["agent"] == me] == []
    assert [e for e in entries if e.agent == me] == []
    # ... and the rest of the crew answered without it
    assert answer["answered"] is True, answer
    assert {c["agent"] for c in answer["calls"] if c["phase"] == "mulling"} == {
        f"{NS}/log-analyst"}
