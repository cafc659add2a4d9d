"""What an agent process does with its Deployment's env beyond the binding: the Agent's
tools and prompts, a phase left unschedulable, the direct probe while the shared state
is empty, declared sizes from the shared state, and its call log.

Agent "processes" run as tasks over one store and one bus (as processes share NATS),
against real emulated GPUs behind the real Ollama adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ollama
import pytest

from kubemoot.agent.direct import direct_name
from kubemoot.agent.discussion import AgentProfile
from kubemoot.agent.process import AgentIdentity, serve_agent
from kubemoot.agent.runtime import CallRecord
from kubemoot.agent.toolloop import Tool
from kubemoot.api.errors import InputError
from kubemoot.clock import SystemClock
from kubemoot.dashboard.calllog import CALL_LOG_BUCKET, CallEntry, CallLogWriter
from kubemoot.settings import Settings
from kubemoot.store.bus import MemoryBus
from kubemoot.store.declared import MODEL_SIZES_BUCKET, read_declared_sizes
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    ProviderState,
    ProviderTickets,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import KV
from kubemoot.testing.waiting import until_stored

from .conftest import (  # OllamaEmulator: the emulator's class, as the fixture makes it
    CREW,
    FAST,
    OllamaEmulator,
    binding,
    chat_client,
    make_client,
    publish_providers,
)

UNSCHEDULABLE = "0/2 models are available for phase mulling: 2 didn't match require selector."


async def _echo(arguments: Mapping[str, Any]) -> str:
    return "NAME READY STATUS RESTARTS\npayments-1 1/1 Running 9"


async def _broken(arguments: Mapping[str, Any]) -> str:
    raise ConnectionError("the kubectl proxy is down")


async def _flood(arguments: Mapping[str, Any]) -> str:
    return "pod restarted; " * 3000  # far more than a 4096-token context holds


def _keep_calling(model: str, messages: Any, tools: Any) -> list[dict[str, Any]]:
    """A model that calls the first tool it is offered on every turn."""
    name = tools[0]["function"]["name"]
    return [{"id": f"call_{len(messages)}", "function": {"name": name, "arguments": {}}}]


TOOLBOX = {
    "kubectl_get": Tool("kubectl_get", "List Kubernetes objects", _echo),
    "kubectl_broken": Tool("kubectl_broken", "List Kubernetes objects", _broken),
    "kubectl_flood": Tool("kubectl_flood", "List Kubernetes objects", _flood),
}


@dataclass
class Processes:
    """Agent "processes" (tasks) over one store and bus, each with its own runtime."""

    kv: KV
    bus: MemoryBus
    settings: Settings = FAST
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    records: list[CallRecord] = field(default_factory=list)
    profiles: dict[str, list[AgentProfile]] = field(default_factory=dict)
    news: asyncio.Event = field(default_factory=asyncio.Event)

    def _seen(self, name: str, profile: AgentProfile) -> None:
        self.profiles[name].append(profile)
        self.news.set()

    async def until_profile(self, name: str, check: Callable[[AgentProfile], bool], *,
                            what: str) -> None:
        """Wait, on the process's ``changed`` listener, until its profile passes."""
        async with asyncio.timeout(30):
            while not check(self.profiles[name][-1]):
                self.news.clear()
                await self.news.wait()

    async def start(self, name: str, env: Mapping[str, str], *, role: str = "member",
                    **options: Any) -> None:
        up = asyncio.Event()
        self.profiles.setdefault(name, [])

        def ready(profile: AgentProfile) -> None:
            self._seen(name, profile)
            up.set()

        task = asyncio.create_task(serve_agent(
            self.kv, self.bus, AgentIdentity(name, CREW.namespace, CREW, role), env=env,
            settings=self.settings, make_client=make_client, chat_factory=chat_client,
            clock=SystemClock(), ready=ready, toolbox=TOOLBOX,
            changed=lambda profile: self._seen(name, profile),
            on_record=[self.records.append, *options.pop("on_record", ())], **options))
        self.tasks.append(task)
        done, _ = await asyncio.wait([task, asyncio.ensure_future(up.wait())],
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()

    async def ask(self, question: str) -> dict[str, Any]:
        raw = await self.bus.request(CREW.ask_subject(),
                                     json.dumps({"question": question}).encode(), timeout=60)
        body: dict[str, Any] = json.loads(raw)
        return body

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        # a process that stopped on its own has said why already (start raised it)
        await asyncio.gather(*self.tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def processes(settings: Settings = FAST) -> AsyncIterator[Processes]:
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    crew = Processes(kv, bus, settings)
    try:
        yield crew
    finally:
        await crew.close()
        await bus.close()
        await kv.close()


def prompts(tmp_path: Path, **files: str) -> dict[str, str]:
    """A ConfigMap's keys as its volume lays them out, and the env naming them."""
    for key, text in files.items():
        (tmp_path / key).write_text(text, encoding="utf-8")
    return {"KUBEMOOT_PROMPTS_DIR": str(tmp_path),
            "KUBEMOOT_AGENT_PROMPT_REFS": json.dumps(list(files))}


def tools(*names: str) -> dict[str, str]:
    return {"KUBEMOOT_AGENT_ENABLED_TOOLS": json.dumps(list(names))}


# -- enabledTools and promptRefs -----------------------------------------------------


async def test_an_agent_calls_its_enabled_tools_with_its_prompts_as_system_prompt(
    make_emulator: Callable[..., OllamaEmulator], tmp_path: Path,
) -> None:
    gpu = make_emulator()
    async with processes() as crew:
        await publish_providers(crew.kv, {"gpu-a": gpu})
        await crew.start("coordinator", binding(("qwen3:8b",), "phi3:mini"), role="coordinator")
        env = {**binding(("qwen3:8b",), "phi3:mini"), **tools("kubectl_get"),
               **prompts(tmp_path, protocol="Speak in one paragraph.",
                         style="Name the object you looked at.")}
        await crew.start("kubectl-agent", env)
        reply = await crew.ask("Pods restart; use kubectl_get and say why.")
        # A ConfigMap edit reaches the mounted file; the next thread uses it.
        (tmp_path / "style").write_text("Answer in French.", encoding="utf-8")
        await crew.until_profile("kubectl-agent", lambda p: "French" in p.system_prompt,
                                 what="the edited prompt read")
        await crew.ask("Pods restart again; use kubectl_get once more.")

    assert reply["answered"] is True, reply
    (mulling,) = [c for c in reply["calls"] if c["phase"] == "mulling"]
    assert mulling["agent"] == "crew-a/kubectl-agent" and mulling["ok"]
    assert mulling["modelCalls"] == 2  # the tool call, then the answer
    chats = [r for r in gpu.records if r.path == "/api/chat" and r.tools]
    first, second = chats[0].messages, chats[1].messages
    assert first[0] == {"role": "system", "content":
                        "Speak in one paragraph.\n\nName the object you looked at."}
    assert second[-1]["role"] == "tool" and "payments-1" in second[-1]["content"]
    later = [r for r in gpu.records if r.path == "/api/chat" and r.tools][2:]
    assert later and later[0].messages[0]["content"].endswith("Answer in French.")


@pytest.mark.parametrize(("tool", "failure"), [
    ("kubectl_broken", "TOOL_FAILURES"),
    ("kubectl_flood", "CONTEXT_EXCEEDED"),
])
async def test_the_tool_loop_caps_trip_in_the_agent_process(
    make_emulator: Callable[..., OllamaEmulator], tool: str, failure: str,
) -> None:
    gpu = make_emulator(tool_rule=_keep_calling)
    async with processes() as crew:
        await publish_providers(crew.kv, {"gpu-a": gpu})
        await crew.start("coordinator", binding(("qwen3:8b",), "phi3:mini"), role="coordinator")
        await crew.start("kubectl-agent", {**binding(("qwen3:8b",), "phi3:mini"),
                                           **tools(tool)})
        reply = await crew.ask(f"Pods restart; use {tool} and keep using {tool}.")

    (signal,) = [s for s in reply["signals"] if s["agent"] == "crew-a/kubectl-agent"
                 and s["phase"] == "mulling"]
    assert signal["type"] == "failure", signal
    assert signal["metadata"]["failureType"] == failure
    if failure == "TOOL_FAILURES":
        assert signal["metadata"]["failedTool"] == tool
        assert "proxy is down" in signal["metadata"]["lastError"]


@pytest.mark.parametrize(("env", "field"), [
    ({"KUBEMOOT_AGENT_ENABLED_TOOLS": '["kubectl_get", "rm_rf"]'},
     "KUBEMOOT_AGENT_ENABLED_TOOLS[1]"),
    ({"KUBEMOOT_AGENT_ENABLED_TOOLS": '"kubectl_get"'}, "KUBEMOOT_AGENT_ENABLED_TOOLS"),
    ({"KUBEMOOT_AGENT_PROMPT_REFS": '["missing-key"]'}, "KUBEMOOT_AGENT_PROMPT_REFS[0]"),
    ({"KUBEMOOT_AGENT_PROMPT_REFS": '["../etc"]'}, "KUBEMOOT_AGENT_PROMPT_REFS[0]"),
])
async def test_an_unknown_tool_or_missing_prompt_stops_the_agent_naming_the_entry(
    env: dict[str, str], field: str, tmp_path: Path,
) -> None:
    async with processes() as crew:
        with pytest.raises(InputError) as caught:
            await crew.start("kubectl-agent", {**binding(("qwen3:8b",)), **env,
                                               "KUBEMOOT_PROMPTS_DIR": str(tmp_path)})
    assert caught.value.field == field


# -- a phase the operator left unschedulable ------------------------------------------


async def test_an_unschedulable_phase_makes_no_call_and_the_crew_answers_with_the_reason(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpu = make_emulator()
    async with processes() as crew:
        await publish_providers(crew.kv, {"gpu-a": gpu})
        await crew.start("coordinator", binding(("qwen3:8b",), "phi3:mini"), role="coordinator")
        # What the operator leaves in the env: the triage binding, the reason, no mulling.
        env = {"KUBEMOOT_TRIAGE_MODEL_MODEL_ID": "phi3:mini",
               "KUBEMOOT_MODEL_UNSCHEDULABLE_REASON": UNSCHEDULABLE}
        await crew.start("kubectl-agent", env)
        asked = len(gpu.records)
        reply = await crew.ask("Pods restart; what is wrong?")

    assert [c for c in reply["calls"] if c["agent"] == "crew-a/kubectl-agent"] == []
    (aside,) = [s for s in reply["signals"] if s["agent"] == "crew-a/kubectl-agent"]
    assert aside["type"] == "stand_aside" and aside["content"] == UNSCHEDULABLE
    assert aside["metadata"]["reason"] == "unschedulable"
    assert UNSCHEDULABLE in reply["answer"] and reply["answered"] is False
    assert reply["settlement"] == "unschedulable"
    # Only the coordinator's own triage reached an engine.
    assert [r.model for r in gpu.records[asked:]] == ["phi3:mini"]


async def test_an_unschedulable_triage_skips_triage_and_the_member_still_mulls(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpu = make_emulator()
    async with processes() as crew:
        await publish_providers(crew.kv, {"gpu-a": gpu})
        await crew.start("coordinator", binding(("qwen3:8b",), "phi3:mini"), role="coordinator")
        env = {**binding(("qwen3:8b",)),
               "KUBEMOOT_TRIAGE_MODEL_UNSCHEDULABLE_REASON": UNSCHEDULABLE.replace(
                   "mulling", "triage"),
               # a stale triage binding the operator did not get to remove is not used
               "KUBEMOOT_TRIAGE_MODEL_MODEL_ID": "phi3:mini"}
        await crew.start("kubectl-agent", env)
        reply = await crew.ask("Pods restart; what is wrong?")

    phases = [c["phase"] for c in reply["calls"] if c["agent"] == "crew-a/kubectl-agent"]
    assert phases == ["mulling"], reply["calls"]
    assert reply["answered"] is True


# -- the direct probe, and the static target following the state ------------------------


async def test_with_no_shared_state_the_agent_probes_directly_then_follows_the_operator(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpu = make_emulator()
    # Copies left resident from before (the operator has not probed since NATS lost
    # its buckets): the direct probe can see them, and warm calls need no VRAM total.
    client = ollama.AsyncClient(host=gpu.url)
    for model in ("qwen3:8b", "phi3:mini"):
        await client.generate(model=model, prompt="", keep_alive="1h")
    env = {**binding(("qwen3:8b",), "phi3:mini"), "KUBEMOOT_MODEL_ENDPOINT": gpu.url,
           "KUBEMOOT_TRIAGE_MODEL_ENDPOINT": gpu.url}
    fast = replace(FAST, runtime=FAST.runtime.with_values({"discovery_seconds": 0.1}))
    direct = direct_name(gpu.url)
    async with processes(fast) as crew:
        await crew.start("coordinator", env, role="coordinator")
        await crew.start("kubectl-agent", env)
        states = await crew.kv.bucket(PROVIDER_STATE_BUCKET)
        stored = await states.get(encode_token(direct))
        assert stored is not None and ProviderState.from_json(stored.value).ready
        first = await crew.ask("Pods restart; what is wrong?")
        static_before = crew.profiles["coordinator"][-1].mulling_static

        await publish_providers(crew.kv, {"gpu-a": gpu})  # the operator's first probe
        for name in ("coordinator", "kubectl-agent"):
            await crew.until_profile(
                name, lambda p: p.mulling_static is not None
                and p.mulling_static.provider == "gpu-a", what=f"{name} following gpu-a")

        async def withdrawn() -> bool:
            return await states.get(encode_token(direct)) is None

        await until_stored(states, withdrawn, timeout=30, what="the direct state withdrawn")
        second = await crew.ask("Pods restart again; what now?")

    assert first["answered"] is True, first
    assert {c["provider"] for c in first["calls"]} == {direct}, first["calls"]
    assert static_before is not None and static_before.provider == direct
    assert second["answered"] is True, second
    assert {c["provider"] for c in second["calls"]} == {"gpu-a"}, second["calls"]
    # the operator's state carries the context the direct probe could not know
    after = crew.profiles["coordinator"][-1].mulling_static
    assert after is not None and after.context_length == 4096


# -- declared sizes from the shared state ------------------------------------------------


async def test_an_agent_sizes_a_never_loaded_model_at_the_vram_mib_in_the_shared_state(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpu = make_emulator()
    declared = {"qwen3:8b": 4999, "phi3:mini": 1999}  # neither engine nor estimate says so
    claims: dict[str, set[int]] = {}
    async with processes() as crew:
        await publish_providers(crew.kv, {"gpu-a": gpu})
        sizes = await crew.kv.bucket(MODEL_SIZES_BUCKET)
        for model, mib in declared.items():  # the operator's document shape
            await sizes.put(encode_token(model), json.dumps(
                {"model": model, "vramMiB": mib, "declaredBy": [f"{model}-a"]}).encode())
        await sizes.put("broken", b"{}")  # skipped, with a warning
        tickets = await crew.kv.bucket(PROVIDER_TICKETS_BUCKET)
        watch = tickets.watch()
        collecting = asyncio.create_task(_claims(watch, claims))
        # no KUBEMOOT_MODEL_SIZES_MIB: the shared state is the only declaration
        await crew.start("coordinator", binding(("qwen3:8b",), "phi3:mini"), role="coordinator")
        await crew.start("kubectl-agent", binding(("qwen3:8b",), "phi3:mini"))
        reply = await crew.ask("Pods restart; what is wrong?")
        await watch.aclose()
        with contextlib.suppress(asyncio.CancelledError):
            await collecting
        assert await read_declared_sizes(sizes) == declared

    assert reply["answered"] is True, reply
    assert claims == {model: {mib} for model, mib in declared.items()}, reply["calls"]


# -- the call log ------------------------------------------------------------------------


async def test_every_process_logs_its_own_calls_with_their_decision(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(), "gpu-b": make_emulator()}
    async with processes() as crew:
        await publish_providers(crew.kv, gpus)
        writers: list[CallLogWriter] = []
        for name, role in (("coordinator", "coordinator"), ("kubectl-agent", "member"),
                           ("log-analyst", "member")):
            writer = await CallLogWriter.open(crew.kv)
            writers.append(writer)
            await crew.start(name, binding(("qwen3:8b", "llama3.1:8b"), "phi3:mini"),
                             role=role, on_record=[writer.record])
        reply = await crew.ask("Pods restart; what is wrong?")
        for writer in writers:
            await writer.flush()
        bucket = await crew.kv.bucket(CALL_LOG_BUCKET)
        entries = [CallEntry.from_json(e.value) for k in await bucket.keys()
                   if (e := await bucket.get(k)) is not None]

    calls = reply["calls"]
    assert reply["answered"] is True and len(entries) == len(calls) > 0
    assert sorted((e.agent, e.phase, e.provider) for e in entries) == sorted(
        (c["agent"], c["phase"], c["provider"]) for c in calls)
    for call in calls:
        decision = call["decision"]
        assert decision["action"] == call["action"]
        assert decision["victims"] == call["evicted"]
        assert decision["options"], decision
        assert all(o["seconds"] >= 0 for o in decision["options"])
    for entry in entries:
        assert entry.decision is not None and entry.decision["action"] == entry.action
    # two 8B models, one per card: the second member's decision shows what ruled out the
    # card the first took (its fit gate), with the reason
    failed = [g for c in calls for g in c["decision"]["failedGates"]]
    assert any(g["gate"] and g["reason"] for g in failed), calls


# -- helpers -----------------------------------------------------------------------------


async def _claims(watch: Any, into: dict[str, set[int]]) -> None:
    async for change in watch:
        if change.value is None:
            continue
        for ticket in ProviderTickets.from_json(change.value).tickets:
            if ticket.model_footprint_mib > 0:
                into.setdefault(ticket.model, set()).add(ticket.model_footprint_mib)


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(("env", "names"), [
    ({"KUBEMOOT_AGENT_ENABLED_TOOLS": '["kubectl_get","kubectl_delete"]'},
     "KUBEMOOT_AGENT_ENABLED_TOOLS[1]"),
    ({"KUBEMOOT_AGENT_PROMPT_REFS": '["response-style"]', "KUBEMOOT_PROMPTS_DIR": "/nonexistent"},
     "KUBEMOOT_AGENT_PROMPT_REFS[0]"),
])
def test_kubemoot_agent_exits_2_naming_an_unknown_tool_or_a_missing_prompt(
    env: dict[str, str], names: str,
) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBEMOOT_")}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("kubemoot")), "agent"], capture_output=True,
        text=True, timeout=60, check=False,
        env={**base, "KUBEMOOT_AGENT_NAME": "a", "KUBEMOOT_AGENT_NAMESPACE": "ns",
             "KUBEMOOT_CREW": "c", "KUBEMOOT_NATS_URL": "nats://127.0.0.1:1", **env})
    assert done.returncode == 2, done.stderr
    assert names in done.stderr and "Traceback" not in done.stderr
