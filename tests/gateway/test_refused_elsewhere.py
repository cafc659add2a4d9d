"""A gateway call whose provider refuses the connection is placed once more, elsewhere.

``gpu-a`` holds small:1b warm when the gateway probes it, then stops listening: its port
refuses every connection while the published state still shows the warm copy, so the
cheapest placement is there. The official ``ollama`` client must still get its answer
(from ``gpu-b``), ``gpu-a``'s circuit must count one fault, and no ticket may stay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import ollama
import pytest

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.runtime.calls import CallRecord
from kubemoot.settings import GatewaySettings
from tests.gateway.conftest import live_tickets, start_gateway

HELLO = [{"role": "user", "content": "hello there"}]
# No probe during the test: the published state keeps showing gpu-a's warm copy.
QUIET = GatewaySettings(wait_limit_seconds=5.0, provider_probe_seconds=3600.0)

Start = Callable[[tuple[str, ...]], Awaitable[tuple[GatewayServer, list[CallRecord]]]]


@pytest.fixture
async def refusing(make_emulator: Callable[..., OllamaEmulator]) -> AsyncIterator[Start]:
    started: list[GatewayServer] = []

    async def start(names: tuple[str, ...]) -> tuple[GatewayServer, list[CallRecord]]:
        emulators = {name: make_emulator() for name in names}
        await ollama.AsyncClient(host=emulators["gpu-a"].url).generate(model="small:1b")
        records: list[CallRecord] = []
        gateway = await start_gateway(emulators, settings=QUIET, on_call=[records.append])
        started.append(gateway)
        emulators["gpu-a"].stop()  # from now on its port refuses
        return gateway, records

    yield start
    for gateway in started:
        await gateway.stop()


def _failures(gateway: GatewayServer, provider: str) -> int:
    assert gateway.stack is not None and gateway.stack.view.circuits is not None
    return gateway.stack.view.circuits.failures(provider)


async def test_the_call_lands_on_the_provider_that_answers(refusing: Start) -> None:
    gateway, records = await refusing(("gpu-a", "gpu-b"))
    reply = await ollama.AsyncClient(host=gateway.url).chat(model="small:1b",
                                                            messages=HELLO)
    assert reply.done and "small:1b" in (reply.message.content or "")
    assert [(r.provider, r.ok) for r in records] == [("gpu-a", False), ("gpu-b", True)]
    assert _failures(gateway, "gpu-a") == 1 and _failures(gateway, "gpu-b") == 0
    assert gateway.desk is not None and not gateway.desk.in_flight
    assert await live_tickets(gateway) == []


async def test_with_nowhere_else_the_client_gets_the_busy_answer(refusing: Start) -> None:
    gateway, records = await refusing(("gpu-a",))
    client = ollama.AsyncClient(host=gateway.url,
                                headers={"X-Kubemoot-Wait-Budget": "0"})
    with pytest.raises(ollama.ResponseError) as caught:
        await client.chat(model="small:1b", messages=HELLO)
    assert caught.value.status_code == 503
    # one attempt on gpu-a, never a second one on the endpoint that refused
    assert [r.provider for r in records] == ["gpu-a"]
    assert _failures(gateway, "gpu-a") == 1
    assert await live_tickets(gateway) == []
