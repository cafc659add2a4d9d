"""The gateway's calls through the runtime's call service (DESIGN §9 "When things
break", "Wait means one thing").

* A model that only providers of unknown memory could load is refused at once, with a
  message that names the missing ``vramMiB`` — not after the whole wait budget as busy.
* A provider that does not answer is a 503 with ``Retry-After`` — never a 404, and
  never a wait: the model exists, its server is down.
* ``X-Kubemoot-Wait-Seconds`` runs from arrival to the start of inference, a cold load
  included; ``X-Kubemoot-Placement-Seconds`` is the deciding-and-claiming part.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import ollama
import pytest

from kubemoot import metrics
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer, ProviderSource
from kubemoot.settings import GatewaySettings
from kubemoot.store.memory import MemoryKV
from tests.gateway.conftest import finished_calls, live_tickets, start_gateway

HELLO = [{"role": "user", "content": "hello there"}]
# a budget no test may wait out: an answer proves the call did not wait for capacity
PATIENT = {"X-Kubemoot-Wait-Budget": "600"}
GUARD_SECONDS = 60  # only against a hang; the assertions are on behaviour


def _waits() -> float:
    value = metrics.REGISTRY.get_sample_value("kubemoot_waits_total")
    return 0.0 if value is None else value


async def _unknown_memory_gateway(emulator: OllamaEmulator) -> GatewayServer:
    source = ProviderSource("gpu-a", emulator.url, context_length=1024, num_parallel=2,
                            reserve_mib=512, total_vram_mib=None)  # no vramMiB given
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=[source], port=0,
                            settings=GatewaySettings(wait_limit_seconds=600.0))
    await gateway.start()
    return gateway


async def test_unknown_memory_refuses_a_cold_only_model_at_once_naming_vram_mib(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gateway = await _unknown_memory_gateway(make_emulator())
    before = _waits()
    try:
        client = ollama.AsyncClient(host=gateway.url, headers=PATIENT)
        with pytest.raises(ollama.ResponseError) as caught:
            async with asyncio.timeout(GUARD_SECONDS):
                await client.chat(model="small:1b", messages=HELLO)
        assert caught.value.status_code == 400
        assert "vramMiB" in str(caught.value.error) and "gpu-a" in str(caught.value.error)
        assert _waits() == before  # it never joined the waiter's line
        assert await live_tickets(gateway) == []
    finally:
        await gateway.stop()


async def test_unknown_memory_still_serves_a_copy_that_is_already_loaded(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator()
    await ollama.AsyncClient(host=emulator.url).generate(model="small:1b")  # warm
    gateway = await _unknown_memory_gateway(emulator)
    try:
        reply = await ollama.AsyncClient(host=gateway.url, headers=PATIENT).chat(
            model="small:1b", messages=HELLO)
        assert reply.done
    finally:
        await gateway.stop()


async def test_a_provider_down_since_start_up_is_a_503_with_retry_after(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator()
    emulator.stop()  # its port refuses from before the gateway's first probe
    gateway = await start_gateway({"gpu-a": emulator})
    try:
        async with httpx.AsyncClient(base_url=gateway.url, headers=PATIENT) as http:
            for path, body in (("/api/chat", {"model": "small:1b", "messages": HELLO}),
                               ("/v1/chat/completions",
                                {"model": "small:1b", "messages": HELLO})):
                answer = await http.post(path, json=body)
                assert answer.status_code == 503, answer.text  # never 404
                assert int(answer.headers["retry-after"]) >= 1
                assert "do not answer" in answer.text
    finally:
        await gateway.stop()


async def test_a_provider_that_went_down_answers_503_at_once_not_after_the_budget(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator()
    gateway = await start_gateway({"gpu-a": emulator})
    assert gateway.prober is not None and gateway.stack is not None
    try:
        async with httpx.AsyncClient(base_url=gateway.url, headers=PATIENT,
                                     timeout=GUARD_SECONDS) as http:
            body = {"model": "small:1b", "messages": HELLO, "stream": False}
            assert (await http.post("/api/chat", json=body)).status_code == 200
            emulator.stop()
            state = await gateway.prober.probe_one(gateway.clients["gpu-a"])
            assert not state.ready
            gateway.stack.view.invalidate("gpu-a")  # read what the probe published
            before = _waits()
            answer = await http.post("/api/chat", json=body)
            assert answer.status_code == 503, answer.text
            assert "retry-after" in answer.headers and "gpu-a" in answer.json()["error"]
            assert _waits() == before
    finally:
        await gateway.stop()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_wait_header_counts_a_cold_load(
    make_emulator: Callable[..., OllamaEmulator], stream: bool,
) -> None:
    # real time on the emulator (time_scale 1): the engine's own load_duration is in
    # the same seconds as the gateway's clock; small:1b (1000 MiB) loads in 0.2 s
    emulator = make_emulator(time_scale=1.0, load_rate_mibps=5000.0, base_latency_s=0.01)
    gateway = await start_gateway({"gpu-a": emulator})
    finished = finished_calls(gateway)
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=GUARD_SECONDS) as http:
            body = {"model": "small:1b", "messages": HELLO, "stream": stream}
            async with http.stream("POST", "/api/chat", json=body) as answer:
                assert answer.status_code == 200
                lines = [line async for line in answer.aiter_lines() if line.strip()]
            headers = answer.headers
        final = httpx.Response(200, content=lines[-1]).json()
        load = final["load_duration"] / 1e9
        assert headers["x-kubemoot-action"] == "cold-load" and load > 0
        waited = float(headers["x-kubemoot-wait-seconds"])
        placing = float(headers["x-kubemoot-placement-seconds"])
        assert waited >= placing + load - 0.001  # the load is part of the wait
        await finished.until(1)
        record = finished.records[0].to_dict()  # the call log's line says the same
        assert record["waitedSeconds"] >= record["placementSeconds"] + load - 0.001
        decision = record["decision"]  # the per-call decision record
        assert decision["action"] == "cold-load"
        assert any(o["kind"] == "cold-load" and o["seconds"] > 0 for o in decision["options"])
    finally:
        await gateway.stop()
