"""The one runtime builder: every part gets the settings, and a store that cannot watch."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from kubemoot import metrics
from kubemoot.clock import ManualClock
from kubemoot.runtime.builder import build_runtime
from kubemoot.runtime.placement import CandidateModel
from kubemoot.runtime.refusals import Reason
from kubemoot.settings import RuntimeSettings
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.metrics import FINISHED
from kubemoot.sim.policies import SimContext
from kubemoot.sim.runtime_policy import KubemootPolicy
from kubemoot.sim.vloop import run_virtual
from kubemoot.sim.workload import CallSpec, Trace
from kubemoot.store.documents import ProviderTickets
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import KV, Bucket, Change, StoreError, Watch
from kubemoot.testing.state import GIB, NOW, gpu, ticket


class _Unwatchable:
    """A bucket whose watches cannot be established (a store without watches)."""

    def __init__(self, inner: Bucket) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def watch(self) -> Watch:
        return _BrokenWatch()


class _BrokenWatch:
    async def ready(self) -> None:
        raise StoreError("this store cannot watch")

    def __aiter__(self) -> AsyncIterator[Change]:
        raise StoreError("this store cannot watch")

    async def aclose(self) -> None:
        return None


class _UnwatchableKV:
    def __init__(self, inner: KV) -> None:
        self._inner = inner

    async def bucket(self, name: str, **options: object) -> Bucket:
        return _Unwatchable(await self._inner.bucket(name, **options))  # type: ignore[arg-type, return-value]

    async def close(self) -> None:
        await self._inner.close()


async def test_the_settings_reach_tickets_circuits_and_the_waiter() -> None:
    clock = ManualClock(NOW)
    kv = MemoryKV(clock=clock)
    settings = RuntimeSettings(ticket_ttl_seconds=42.0, claim_attempts=3,
                               claim_line_seconds=2.0, circuit_failure_threshold=2,
                               demand_wait_ttl_seconds=7.0, demand_intent_ttl_seconds=8.0,
                               demand_use_window_seconds=9.0, selection_window_seconds=10.0)
    runtime = await build_runtime(kv, clock=clock, settings=settings,
                                  declared={"qwen3:8b": 6 * GIB})
    await runtime.states.put(encode_token("gpu-a"), gpu("gpu-a", 24).to_json())
    assert (runtime.tickets.ttl_seconds, runtime.tickets.max_attempts,
            runtime.tickets.line_seconds) == (42.0, 3, 2.0)
    # The demand board's windows were the defaults whatever the settings said.
    board = runtime.board
    assert (board.wait_ttl_seconds, board.intent_ttl_seconds, board.use_window_seconds,
            board.selection_ttl_seconds) == (7.0, 8.0, 9.0, 10.0)
    assert runtime.planner.view is runtime.view and runtime.planner.tickets is runtime.tickets

    # Two faults open gpu-a's circuit: the next call is not sent there.
    for _ in range(2):
        placement = await runtime.planner.place([CandidateModel("qwen3:8b")], holder_id="me")
        assert placement.provider == "gpu-a"
        await runtime.planner.finish(placement, ok=False)
    runtime.view.invalidate()
    placement = await runtime.planner.place([CandidateModel("qwen3:8b")], holder_id="me")
    assert placement.provider is None
    await kv.close()


async def test_a_store_that_cannot_watch_stands_busy_calls_aside_at_once() -> None:
    clock = ManualClock(NOW)
    kv = _UnwatchableKV(MemoryKV(clock=clock))
    runtime = await build_runtime(kv, clock=clock)  # type: ignore[arg-type]
    await runtime.states.put(encode_token("gpu-a"),
                             gpu("gpu-a", 24, residents={"qwen3:8b": 6}).to_json())
    busy = ticket("qwen3:8b", footprint_gib=0.0, ident="busy")
    await runtime.tickets_bucket.put(
        encode_token("gpu-a"), ProviderTickets(provider="gpu-a", tickets=[busy]).to_json()
    )
    await runtime.start(follow=False)
    assert runtime.waking is None  # no wake source
    waits = metrics.WAITS._value.get()  # type: ignore[attr-defined]
    placement = await runtime.waiter.place([CandidateModel("qwen3:8b")], agent="alice")
    assert placement.ticket is None and placement.reason == Reason.GPU_BUSY.value
    assert metrics.WAITS._value.get() == waits  # type: ignore[attr-defined]  # never joined a line
    await runtime.close()
    await kv.close()


def test_the_simulator_runs_with_circuit_breakers() -> None:
    """The simulator's runtime is the production one: an open circuit keeps calls off."""

    async def scenario() -> tuple[str, str | None]:
        card = EmulatedGpu("gpu-a", vram_mib=24 * GIB, sizes_mib={"qwen3:8b": 6 * GIB})
        ctx = SimContext(gpus={"gpu-a": card}, sizes={"qwen3:8b": 6 * GIB},
                         trace=Trace(discussions=(), call_count=0), rng=random.Random(1),
                         extras={"gpu_wait_limit_seconds": 5.0})
        policy = KubemootPolicy(RuntimeSettings(circuit_failure_threshold=1))
        await policy.start(ctx)
        call = CallSpec(call_id=1, discussion_id=1, agent="alice", phase="answer",
                        candidates=(CandidateModel("qwen3:8b", 70.0),), duration=1.0,
                        prompt_tokens=100)
        first = await policy.run_call(call, ctx)
        assert first.status == FINISHED
        assert policy.runtime is not None
        policy.runtime.circuits.record_failure("gpu-a")  # as a provider fault would
        second = await policy.run_call(call, ctx)
        await policy.stop()
        return second.status, second.provider

    kind, provider = run_virtual(scenario())
    assert kind != FINISHED and provider is None



async def test_a_live_client_directory_empty_at_build_time_is_kept() -> None:
    # A crew process builds its runtime before the operator has published any provider:
    # the mapping it passes is empty then and filled later. The planner must keep that
    # very mapping (an empty one is falsy; ``clients or {}`` used to swap it out).
    clock = ManualClock(NOW)
    kv = MemoryKV(clock)
    directory: dict[str, EmulatedGpu] = {}
    runtime = await build_runtime(kv, clock=clock, clients=directory)
    directory["gpu-a"] = EmulatedGpu("gpu-a", vram_mib=24 * GIB, sizes_mib={})
    assert runtime.planner.clients["gpu-a"] is directory["gpu-a"]
    await kv.close()


async def test_the_runtimes_own_ticket_writes_are_not_parsed_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The built ticket manager hands the documents it writes to the parses its view and
    capacity watch share: a claim and a release of this process cost no parse there."""
    parsed: list[bytes] = []
    parse = ProviderTickets.from_json

    def counted(value: bytes) -> ProviderTickets:
        parsed.append(value)
        return parse(value)

    monkeypatch.setattr(ProviderTickets, "from_json", counted)
    clock = ManualClock(NOW)
    kv = MemoryKV(clock=clock)
    runtime = await build_runtime(kv, clock=clock)
    await runtime.states.put(encode_token("gpu-a"), gpu("gpu-a", 24).to_json())
    await runtime.start()
    seen = runtime.watch.counter
    granted = await runtime.tickets.claim("gpu-a", "qwen3:8b", 4 * GIB, "me")
    seen = await runtime.watch.changed_since(seen, 5.0)
    await runtime.tickets.release("gpu-a", granted.ticket_id)
    await runtime.watch.changed_since(seen, 5.0)
    runtime.view.invalidate(None)
    p = (await runtime.view.snapshot()).provider("gpu-a")
    assert p is not None and p.tickets == ()
    assert parsed == []
    await runtime.close()
    await kv.close()
