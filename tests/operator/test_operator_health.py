"""The operator's Pod probes: kopf's ``/healthz`` answers while the operator serves."""

from __future__ import annotations

from typing import Any

import httpx

from kubemoot.testing.nats_server import free_port

from .conftest import OperatorThread, _watches_open, declare_resources, eventually


async def test_the_health_endpoint_answers_while_the_operator_serves(kmock: Any) -> None:
    declare_resources(kmock)
    port = free_port()
    operator = OperatorThread(str(kmock.url).rstrip("/"),
                              liveness_endpoint=f"http://127.0.0.1:{port}/healthz")
    operator.start()
    try:
        await _watches_open(kmock)
        async with httpx.AsyncClient() as http:

            async def healthy() -> bool:
                try:
                    response = await http.get(f"http://127.0.0.1:{port}/healthz")
                except httpx.TransportError:
                    return False  # kopf opens it a moment after its watches
                return response.status_code == 200

            assert await eventually(healthy, what="/healthz answering 200")
    finally:
        await operator.stop()
    async with httpx.AsyncClient() as http:
        try:
            await http.get(f"http://127.0.0.1:{port}/healthz")
        except httpx.TransportError:
            pass  # stopped: nothing answers any more, which is what a liveness probe sees
        else:
            raise AssertionError("/healthz still answers after the operator stopped")
