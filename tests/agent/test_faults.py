"""What a call's failure says about its provider, and what a failed release may not do.

A provider's circuit opens on the provider's faults only: a tool that keeps failing or a
prompt that outgrew the context is not the GPU's fault. A half-open circuit lets one
trial call through, however many arrive at once. A release that fails after the engine
answered is logged and counted; the answer still reaches the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from kubemoot import metrics
from kubemoot.agent.discussion import AgentProfile, Coordinator, Thread
from kubemoot.agent.pool import CallSettings, ClientFactory
from kubemoot.agent.runtime import AfterCall
from kubemoot.agent.signals import FailureType
from kubemoot.agent.toolloop import Tool
from kubemoot.agent.wiring import RuntimeStack, build_stack
from kubemoot.clock import Clock, ManualClock, SystemClock
from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.providers.protocol import ProviderClient
from kubemoot.runtime.circuit import CircuitBreakers, CircuitState
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.memory import MemoryKV

SMALL = EmulatedModel("small:1b", 2000)
#: One provider fault opens a circuit here, so a single miscounted call shows.
TOUCHY = RuntimeSettings().with_values({
    "load_rate_mibps": 1e6, "unload_seconds": 0.001, "default_latency_seconds": 0.05,
    "circuit_failure_threshold": 1, "circuit_cooldown_seconds": 30.0,
})


@dataclass
class Fleet:
    stack: RuntimeStack
    emulator: OllamaEmulator
    client: OllamaProvider
    kv: MemoryKV

    @property
    def circuits(self) -> CircuitBreakers:
        circuits = self.stack.view.circuits
        assert circuits is not None
        return circuits


def factory(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
    return OllamaProvider(provider, endpoint, timeout=settings.timeout)


@pytest.fixture
def make_fleet(
    make_emulator: Callable[..., OllamaEmulator],
) -> Callable[..., Any]:

    async def make(*, clock: Clock | None = None, num_parallel: int = 2,
                   after_call: AfterCall | None = None, tool_rule: Any = None,
                   chats: ClientFactory = factory, context: int = 1024,
                   warm: bool = True) -> Fleet:
        emulator = make_emulator(models=(SMALL,), vram_mib=8192, num_parallel=num_parallel,
                                 tool_rule=tool_rule, context_length=context)
        clock = clock or SystemClock()
        kv = MemoryKV(clock=clock)
        client = OllamaProvider("gpu-a", emulator.url, context_length=context,
                                num_parallel=num_parallel, total_vram_mib=8192,
                                reserve_mib=512)
        if warm:
            await client.preload(SMALL.name)  # warm: every placement below is a warm one
        await Prober([client], clock=clock,
                     publish=publish_to_kv(await kv.bucket(PROVIDER_STATE_BUCKET))).probe_all()
        stack = await build_stack(kv, clients={"gpu-a": client}, client_factory=chats,
                                  clock=clock, settings=TOUCHY,
                                  declared={SMALL.name: 2000}, after_call=after_call)
        fleet = Fleet(stack, emulator, client, kv)
        return fleet

    return make


async def _call(fleet: Fleet, text: str, tools: tuple[Tool, ...] = ()) -> Any:
    return await fleet.stack.agents.call(
        agent="crew/a", thread_id="t1", phase="mulling",
        messages=[{"role": "user", "content": text}],
        candidates=[CandidateModel(SMALL.name, 50.0)], tools=tools, wait=False,
    )


async def _close(fleet: Fleet) -> None:
    await fleet.stack.close()
    await fleet.client.close()
    await fleet.kv.close()


def _always_kubectl(model: str, messages: Any, tools: Any) -> list[dict[str, Any]]:
    """A model that keeps asking for the tool, however often it fails."""
    return [{"function": {"name": "kubectl", "arguments": {}}}]


async def _fails(arguments: Mapping[str, Any]) -> str:
    raise ConnectionError("the tool's server is down")


async def _dumps(arguments: Mapping[str, Any]) -> str:
    return "log line\n" * 1000  # about 2 500 tokens: more than the 1 024 context


async def test_tool_failures_leave_the_circuit_closed(make_fleet: Callable[..., Any]) -> None:
    fleet = await make_fleet(tool_rule=_always_kubectl)
    try:
        outcome = await _call(fleet, "please use kubectl",
                              (Tool("kubectl", "runs kubectl", _fails),))
        failure = outcome.result.failure
        assert failure is not None and failure.failure_type is FailureType.TOOL_FAILURES
        assert fleet.circuits.state("gpu-a") is CircuitState.CLOSED
        assert (await _call(fleet, "hello")).result.ok  # the GPU still takes calls
    finally:
        await _close(fleet)


async def test_context_exceeded_leaves_the_circuit_closed(
    make_fleet: Callable[..., Any],
) -> None:
    fleet = await make_fleet()
    try:
        outcome = await _call(fleet, "please use logs", (Tool("logs", "dumps logs", _dumps),))
        failure = outcome.result.failure
        assert failure is not None and failure.failure_type is FailureType.CONTEXT_EXCEEDED
        assert fleet.circuits.state("gpu-a") is CircuitState.CLOSED
    finally:
        await _close(fleet)


async def test_a_provider_fault_still_opens_the_circuit(
    make_fleet: Callable[..., Any],
) -> None:
    fleet = await make_fleet()
    try:
        fleet.emulator.fail_next(500, path="/api/chat")
        outcome = await _call(fleet, "hello")
        failure = outcome.result.failure
        assert failure is not None and failure.failure_type is FailureType.PROVIDER_ERROR
        assert fleet.circuits.state("gpu-a") is CircuitState.OPEN
    finally:
        await _close(fleet)


async def test_half_open_admits_one_trial_call(make_fleet: Callable[..., Any]) -> None:
    clock = ManualClock(1000.0)
    fleet = await make_fleet(clock=clock, num_parallel=8)
    try:
        fleet.circuits.record_failure("gpu-a")
        assert fleet.circuits.state("gpu-a") is CircuitState.OPEN
        clock.advance(TOUCHY.circuit_cooldown_seconds)
        assert fleet.circuits.state("gpu-a") is CircuitState.HALF_OPEN

        placements = await asyncio.gather(*(
            fleet.stack.planner.place([CandidateModel(SMALL.name, 50.0)], holder_id=f"call-{i}")
            for i in range(8)
        ))
        placed = [p for p in placements if p.placed]
        assert len(placed) == 1, [p.action.value for p in placements]
        assert placed[0].provider == "gpu-a"

        # the trial succeeds: the circuit closes and calls flow again
        await fleet.stack.planner.finish(placed[0], seconds=0.1, ok=True)
        assert fleet.circuits.state("gpu-a") is CircuitState.CLOSED
        again = await fleet.stack.planner.place([CandidateModel(SMALL.name, 50.0)],
                                                holder_id="after")
        assert again.placed
        await fleet.stack.planner.finish(again, ok=True)
    finally:
        await _close(fleet)


async def test_a_failed_release_after_an_answer_is_logged_not_raised(
    make_fleet: Callable[..., Any], caplog: pytest.LogCaptureFixture,
) -> None:
    kv_box: list[MemoryKV] = []

    class StoreGoesAway(OllamaProvider):
        async def chat(self, model: str, messages: Any, **options: Any) -> Any:
            reply = await super().chat(model, messages, **options)
            await kv_box[0].close()  # the engine has answered; now the release cannot land
            return reply

    fleet = await make_fleet(chats=lambda provider, endpoint, settings: StoreGoesAway(
        provider, endpoint, timeout=settings.timeout))
    kv_box.append(fleet.kv)
    before = _sample(metrics.ERRORS_SURVIVED, component="runtime", operation="release",
                    kind="store")
    try:
        with caplog.at_level(logging.WARNING, logger="kubemoot.runtime.calls"):
            outcome = await _call(fleet, "hello")
        assert outcome.result is not None and outcome.result.ok
        assert outcome.result.content
        assert outcome.record is not None and outcome.record.ok
        assert any("releasing the ticket" in r.getMessage() and "TTL" in r.getMessage()
                   for r in caplog.records)
        after = _sample(metrics.ERRORS_SURVIVED, component="runtime", operation="release",
                    kind="store")
        assert after == before + 1
    finally:
        await fleet.stack.close()
        await fleet.client.close()


def _sample(counter: Any, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(f"{counter._name}_total", labels)
    return 0.0 if value is None else value


def test_a_trial_that_never_reports_back_lapses_after_a_cooldown() -> None:
    clock = ManualClock(0.0)
    circuits = CircuitBreakers(clock=clock, threshold=1, cooldown_seconds=30.0)
    circuits.record_failure("gpu-a")
    clock.advance(30.0)
    assert circuits.allows("gpu-a") and circuits.admit("gpu-a")
    assert not circuits.allows("gpu-a") and not circuits.admit("gpu-a")
    clock.advance(30.0)  # its holder died: the next call may try
    assert circuits.admit("gpu-a")
    circuits.record_no_verdict("gpu-a")  # cancelled: the trial goes to the next call
    assert circuits.state("gpu-a") is CircuitState.HALF_OPEN and circuits.admit("gpu-a")
    circuits.record_failure("gpu-a")  # the trial failed: a full cool-down again
    assert circuits.state("gpu-a") is CircuitState.OPEN and not circuits.admit("gpu-a")


class _StuckClose(OllamaProvider):
    """A client whose connections cannot be closed cleanly (a half-dead socket)."""

    async def close(self) -> None:
        await super().close()
        raise OSError("connection reset while closing")


async def test_a_pool_that_cannot_close_is_logged_and_counted(
    make_fleet: Callable[..., Any], caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = await make_fleet(
        chats=lambda provider, endpoint, settings: _StuckClose(provider, endpoint))
    assert (await _call(fleet, "hello")).result.ok
    before = _sample(metrics.ERRORS_SURVIVED, component="agent", operation="close-pool",
                     kind="cleanup")
    with caplog.at_level(logging.WARNING, logger="kubemoot.agent.wiring"):
        await _close(fleet)
    assert _sample(metrics.ERRORS_SURVIVED, component="agent",
                   operation="close-pool", kind="cleanup") == before + 1
    assert any("connection reset while closing" in r.getMessage() for r in caplog.records)


async def test_a_plan_that_cannot_be_released_is_logged_and_counted(
    make_fleet: Callable[..., Any], caplog: pytest.LogCaptureFixture,
) -> None:
    box: list[Fleet] = []

    class StoreGoesAway(OllamaProvider):
        async def chat(self, model: str, messages: Any, **options: Any) -> Any:
            try:
                return await super().chat(model, messages, **options)
            finally:  # after the triage call: the held plan cannot be dropped
                await box[0].kv.close()

    # room for the prompt a plan assumes before the question is known; the model is not
    # loaded yet, so the plan made at selection starts its load and is held
    fleet = await make_fleet(context=4096, warm=False,
                             chats=lambda provider, endpoint, settings:
                             StoreGoesAway(provider, endpoint, timeout=settings.timeout))
    box.append(fleet)
    member = AgentProfile(id="crew/a", role="tooler", mulling=(CandidateModel(SMALL.name, 50.0),),
                          triage=(CandidateModel(SMALL.name, 50.0),))
    coordinator = Coordinator(fleet.stack.agents, AgentProfile(
        id="crew/coordinator", role="coordinator", mulling=(CandidateModel(SMALL.name, 70.0),),
    ), deadline_seconds=10)
    fleet.emulator.fail_next(500, path="/api/chat")  # the triage fails: the plan stays held
    before = _sample(metrics.ERRORS_SURVIVED, component="agent", operation="release-plan",
                     kind="store")
    try:
        with caplog.at_level(logging.WARNING, logger="kubemoot.agent.discussion"):
            await coordinator.discuss(Thread("t1", "is the cluster healthy?"), [member])
    finally:
        await fleet.stack.close()
        await fleet.client.close()
    assert _sample(metrics.ERRORS_SURVIVED, component="agent",
                   operation="release-plan", kind="store") == before + 1
    assert any("releasing the plan of crew/a" in r.getMessage() for r in caplog.records)


async def test_half_open_admits_one_call_sharing_a_busy_copy(
    make_fleet: Callable[..., Any],
) -> None:
    """Calls that cannot wait share a warm copy whose slot is taken (a queue claim);
    on a half-open provider only one of them may be the trial."""
    clock = ManualClock(1000.0)
    fleet = await make_fleet(clock=clock, num_parallel=1)
    try:
        busy = await fleet.stack.planner.place([CandidateModel(SMALL.name, 50.0)],
                                               holder_id="long-call")
        assert busy.placed  # holds the copy's only slot from here on
        fleet.circuits.record_failure("gpu-a")
        clock.advance(TOUCHY.circuit_cooldown_seconds)
        assert fleet.circuits.state("gpu-a") is CircuitState.HALF_OPEN

        outcomes = await asyncio.gather(*(_call(fleet, f"hello {i}") for i in range(4)))
        ran = [o for o in outcomes if o.ran]
        assert len(ran) == 1, [o.refusal for o in outcomes]
        assert {o.refusal for o in outcomes if not o.ran} == {"gpu-busy"}
    finally:
        await _close(fleet)
