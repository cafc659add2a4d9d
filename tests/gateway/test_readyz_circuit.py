"""``/readyz`` after a provider's calls failed: unready for a while, never for good.

A load balancer (a Kubernetes Service) sends no calls to a replica whose readiness
probe fails. If readiness waited for a call to succeed, a replica whose provider failed
a few calls would stay out of rotation for good, although the circuit half-opens after
its cool-down exactly to let one call find out whether the provider is well again.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.settings import GatewaySettings, RuntimeSettings
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import start_gateway

BODY = {"model": "small:1b", "messages": [{"role": "user", "content": "hi"}],
        "stream": False}


async def test_failed_calls_make_a_replica_unready_until_its_circuit_half_opens(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator()
    settings = GatewaySettings(wait_limit_seconds=1.0)  # unready after 3 failures
    gateway = await start_gateway(
        {"gpu-a": emulator}, settings=settings,
        runtime=RuntimeSettings(circuit_cooldown_seconds=1.0))  # opens after 3 failures
    try:
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            assert (await http.post("/api/chat", json=BODY)).status_code == 200
            emulator.fail_next(500, count=3, path="/api/chat")
            for _ in range(3):
                assert (await http.post("/api/chat", json=BODY)).status_code == 502
            unready = await http.get("/readyz")
            assert unready.status_code == 503
            inference = unready.json()["checks"]["inference"]
            assert inference["openCircuits"] == ["gpu-a"], inference

            async def ready_again() -> bool:
                return (await http.get("/readyz")).status_code == 200

            # no call in between: nothing but time can make it ready again
            await wait_until(ready_again, timeout=30, what="/readyz ready after the "
                             "circuit's cool-down, with no call in between")
            inference = (await http.get("/readyz")).json()["checks"]["inference"]
            assert inference["openCircuits"] == [] and inference["failuresInARow"] == 3
            assert "calls may try again" in inference["note"]
            # the trial call the load balancer now sends closes the circuit
            assert (await http.post("/api/chat", json=BODY)).status_code == 200
            inference = (await http.get("/readyz")).json()["checks"]["inference"]
            assert inference["failuresInARow"] == 0 and "note" not in inference
    finally:
        await gateway.stop()
