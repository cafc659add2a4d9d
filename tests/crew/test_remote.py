"""The discussion engine across agent "processes": each with its own runtime, talking
over a bus, sharing the store; real emulated GPUs behind the real Ollama adapter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace

from kubemoot.agent.process import ProviderDirectory
from kubemoot.agent.wiring import build_stack
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.runtime.placement import CandidateModel
from kubemoot.store.bus import MemoryBus, Message
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    ProviderTickets,
)
from kubemoot.store.memory import MemoryKV

from .conftest import (
    CREW,
    FAST,
    binding,
    chat_client,
    make_client,
    publish_providers,
    running_crew,
)

QUESTION = "why does the ingress return 502 since the last deploy?"


async def test_members_in_their_own_runtimes_answer_with_per_call_attribution(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(), "gpu-b": make_emulator()}
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    await publish_providers(kv, gpus)
    async with running_crew(kv, bus) as crew:
        await crew.start("coordinator", binding(("qwen3:8b",), "phi3:mini"),
                         role="coordinator")
        await crew.start("kubectl-agent", binding(("qwen3:8b",), "phi3:mini"))
        await crew.start("log-analyst", binding(("llama3.1:8b",), "phi3:mini"))
        reply = await crew.ask(QUESTION)
    await bus.close()
    await kv.close()

    assert reply["answered"] is True, reply
    assert reply["settlement"] == "synthesis"
    assert sorted(reply["selected"]) == ["crew-a/kubectl-agent", "crew-a/log-analyst"]
    calls = reply["calls"]
    mulling = {c["agent"]: c for c in calls if c["phase"] == "mulling"}
    assert set(mulling) == {"crew-a/kubectl-agent", "crew-a/log-analyst"}
    # Two members mulled on two 8B models at once; a card holds one: one card each.
    assert {c["provider"] for c in mulling.values()} == {"gpu-a", "gpu-b"}
    assert {c["model"] for c in mulling.values()} == {"qwen3:8b", "llama3.1:8b"}
    assert all(c["ok"] for c in mulling.values())
    assert any(c["phase"] == "synthesis" and c["agent"] == "crew-a/coordinator" for c in calls)
    for call in calls:
        assert {"provider", "model", "action", "evicted"} <= set(call)
    # Every position names the card the member's own process ran its call on.
    positions = [s for s in reply["signals"] if s["type"] in ("agree", "concern")]
    assert {s["metadata"]["provider"] for s in positions} == {"gpu-a", "gpu-b"}
    # The engines never had to evict on their own: every eviction was planned.
    assert [g.engine.evictions for g in gpus.values()] == [[], []]


async def test_a_member_that_falls_silent_is_a_failure_and_the_crew_still_answers(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(), "gpu-b": make_emulator()}
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    await publish_providers(kv, gpus)
    selected: list[str] = []

    # A member whose process dies right after it was selected: it answered the roll
    # call and took the thread, and is never heard of again.
    async def roll_call(message: Message) -> None:
        await bus.publish(message.reply, json.dumps(
            {"id": "crew-a/ghost", "role": "member",
             "mulling": [{"model": "qwen3:8b", "score": 70}]}).encode())

    async def select(message: Message) -> None:
        selected.append(json.loads(message.data)["threadId"])
        await bus.publish(message.reply, b"{}")

    await bus.subscribe(CREW.subject("rollcall"), roll_call)
    await bus.subscribe(CREW.select_subject("crew-a/ghost"), select)
    async with running_crew(kv, bus) as crew:
        await crew.start("coordinator", binding(("qwen3:8b",), "phi3:mini"),
                         role="coordinator")
        await crew.start("kubectl-agent", binding(("qwen3:8b",), "phi3:mini"))
        reply = await crew.ask(QUESTION)
    await bus.close()
    await kv.close()

    assert selected == [reply["threadId"]]
    assert reply["answered"] is True, reply
    (ghost,) = [s for s in reply["signals"] if s["agent"] == "crew-a/ghost"]
    assert ghost["type"] == "failure"
    assert ghost["metadata"]["failureType"] == "AGENT_ERROR"
    assert "no word from the agent's process" in ghost["metadata"]["lastError"]


async def test_a_member_stopped_mid_discussion_says_so_and_gives_its_tickets_back(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(), "gpu-b": make_emulator()}
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    await publish_providers(kv, gpus)
    for gpu in gpus.values():
        gpu.stall_next(600.0, path="/api/chat", count=10)  # every chat hangs
    async with running_crew(kv, bus) as crew:
        await crew.start("coordinator", binding(("qwen3:8b",)), role="coordinator")
        await crew.start("kubectl-agent", binding(("qwen3:8b",)))
        stopped = asyncio.Event()

        async def on_report(message: Message) -> None:
            # the member holds a ticket (its plan or its running call): stop its process
            if json.loads(message.data).get("kind") == "heartbeat" \
                    and not stopped.is_set() and await _held(kv):
                stopped.set()
                await crew.stop("kubectl-agent")

        async def on_select(message: Message) -> None:  # listens beside the member
            thread = json.loads(message.data)["threadId"]
            await bus.subscribe(CREW.thread_subject(thread, "crew-a/kubectl-agent"),
                                on_report)

        await bus.subscribe(CREW.select_subject("crew-a/kubectl-agent"), on_select)
        reply = await crew.ask(QUESTION)
    # the stopped process gave back its plan and its call's ticket on its way out
    assert not await _held(kv)
    await bus.close()
    await kv.close()

    assert stopped.is_set()
    (member,) = [s for s in reply["signals"] if s["agent"] == "crew-a/kubectl-agent"]
    assert member["type"] == "failure"
    assert "stopped during the discussion" in member["metadata"]["lastError"]
    assert reply["answered"] is False


async def _held(kv: MemoryKV) -> bool:
    tickets = await kv.bucket(PROVIDER_TICKETS_BUCKET)
    for key in await tickets.keys():
        entry = await tickets.get(key)
        if entry is not None and ProviderTickets.from_json(entry.value).tickets:
            return True
    return False


async def test_replicas_of_one_member_take_each_thread_once(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator(), "gpu-b": make_emulator()}
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    await publish_providers(kv, gpus)
    async with running_crew(kv, bus) as crew:
        await crew.start("coordinator", binding(("qwen3:8b",)), role="coordinator")
        await crew.start("kubectl-agent", binding(("qwen3:8b",)))
        await crew.start("kubectl-agent", binding(("qwen3:8b",)), replica=1)
        reply = await crew.ask(QUESTION)
    await bus.close()
    await kv.close()

    assert reply["answered"] is True, reply
    assert reply["selected"] == ["crew-a/kubectl-agent"]
    mulling = [c for c in reply["calls"] if c["phase"] == "mulling"]
    assert [c["agent"] for c in mulling] == ["crew-a/kubectl-agent"]
    positions = [s for s in reply["signals"] if s["type"] in ("agree", "concern")]
    assert len(positions) == 1
    # the engines saw one mulling call and the synthesis, not a second replica's work
    assert sum(len(g.records) for g in gpus.values()) == 2


async def test_a_coordinator_that_stops_mid_discussion_tells_the_asker(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator()}
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    await publish_providers(kv, gpus)
    gpus["gpu-a"].stall_next(30.0, path="/api/chat", count=10)  # the member's call hangs
    async with running_crew(kv, bus) as crew:
        await crew.start("coordinator", binding(("qwen3:8b",)), role="coordinator")
        await crew.start("kubectl-agent", binding(("qwen3:8b",)))
        selected = asyncio.Event()

        async def on_select(message: Message) -> None:  # listens beside the member
            selected.set()

        await bus.subscribe(CREW.select_subject("crew-a/kubectl-agent"), on_select)
        asking = asyncio.ensure_future(crew.ask(QUESTION))
        await selected.wait()
        await crew.stop("coordinator")
        reply = await asking
    await bus.close()
    await kv.close()

    assert "the coordinator stopped" in reply["error"]


async def test_the_deadline_reaches_a_member_waiting_for_a_gpu_in_its_own_process(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator()}  # one card: one 8B model at a time
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    await publish_providers(kv, gpus)
    # Someone else's call holds qwen3:8b on the only card and does not finish.
    other = await build_stack(kv, clients=ProviderDirectory(
        await kv.bucket(PROVIDER_STATE_BUCKET), make_client), client_factory=chat_client,
        clock=SystemClock(), settings=FAST.runtime)
    assert isinstance(other.planner.clients, ProviderDirectory)
    await other.planner.clients.refresh()
    busy = await other.planner.place([CandidateModel("qwen3:8b")], holder_id="someone-else",
                                     prompt_tokens=100)
    assert busy.placed
    # The coordinator's deadline is 1 s; the member would wait 20 s on its own.
    short = replace(FAST, runtime=FAST.runtime.with_values({"gpu_wait_limit_seconds": 1.0}))
    async with running_crew(kv, bus) as crew:
        await crew.start("coordinator", binding(("qwen3:8b",)), role="coordinator",
                         settings=short)
        await crew.start("log-analyst", binding(("llama3.1:8b",)))
        reply = await crew.ask(QUESTION)
    await other.planner.finish(busy)
    await other.close()
    await bus.close()
    await kv.close()

    kinds = [(s["type"], s["metadata"].get("reason")) for s in reply["signals"]
             if s["agent"] == "crew-a/log-analyst"]
    # it waited for the busy card, then stood aside when the coordinator's deadline
    # reached its process (not at its own 20 s limit, not as a silent failure)
    assert kinds == [("waiting", "gpu-busy"), ("stand_aside", "gpu-busy")]
    assert reply["settlement"] == "capacity" and reply["answered"] is False
    assert "could not get a GPU" in reply["answer"]


async def test_a_crew_whose_members_are_all_down_says_so(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator()}
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    await publish_providers(kv, gpus)
    async with running_crew(kv, bus) as crew:
        await crew.start("coordinator", binding(("qwen3:8b",)), role="coordinator")
        reply = await crew.ask(QUESTION)
    await bus.close()
    await kv.close()

    assert reply["answered"] is False and reply["settlement"] == "no-contribution"
    assert "No member of crew crew-a/pilot answered the roll call" in reply["answer"]
    assert reply["members"] == [] and reply["calls"] == []
    assert gpus["gpu-a"].records == []  # nothing to discuss, nothing was run
