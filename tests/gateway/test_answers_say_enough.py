"""Gateway answers that say enough: the sizes behind model-too-large, a Retry-After
that counts the work in flight, and one rule for a reply's ``model`` on every route."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from kubemoot.api.loader import load_bundle
from kubemoot.clock import ManualClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.gateway.classes import ModelClassBook
from kubemoot.settings import GatewaySettings, RuntimeSettings
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    ProviderTickets,
    TicketState,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import NOW, gpu, ticket
from tests.gateway.conftest import Fleet, start_gateway
from tests.gateway.test_model_classes import BUNDLE

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def classes(tmp_path: Path) -> ModelClassBook:
    """The ModelClasses of test_model_classes: "smart" stands for medium:7b."""
    path = tmp_path / "bundle.yaml"
    path.write_text(BUNDLE)
    bundle = load_bundle([path])
    return ModelClassBook(bundle.model_classes, bundle.models, bundle.providers,
                          runtime_tolerance=10.0)


async def test_model_too_large_names_the_footprint_and_the_largest_card(
        fleet: Fleet) -> None:
    assert fleet.gateway.stack is not None
    view = fleet.gateway.stack.view
    need = fleet.gateway.stack.planner.occupancy.occupancy("huge:70b", await view.snapshot())
    with pytest.raises(ollama.ResponseError) as caught:
        await ollama.AsyncClient(host=fleet.url).chat(model="huge:70b", messages=HELLO)
    assert caught.value.status_code == 400
    # two 8192 MiB cards with a 512 MiB reserve each
    assert f"it needs {need} MiB" in caught.value.error
    assert "largest usable memory in the fleet is 7680 MiB on gpu-a" in caught.value.error


async def test_retry_after_counts_the_load_and_the_call_in_flight() -> None:
    """23 GiB usable: x (4 GiB, idle) resident and z (16 GiB) 3 s into its 16 s load.
    big:7b (12 GiB) fits only once z's call is done: 13 s of load, then 5 s of call.
    The wait's own last options said nothing of it (the old answer was 1 s)."""
    clock = ManualClock(NOW)
    kv = MemoryKV(clock=clock)
    states = await kv.bucket(PROVIDER_STATE_BUCKET)
    await states.put(encode_token("gpu-a"),
                     gpu("gpu-a", 24, residents={"x:1b": 4}).to_json())
    tickets = await kv.bucket(PROVIDER_TICKETS_BUCKET)
    loading = ticket("z:1b", age=3, state=TicketState.LOADING, footprint_gib=16)
    await tickets.put(encode_token("gpu-a"),
                      ProviderTickets(provider="gpu-a", tickets=[loading]).to_json())
    gateway = GatewayServer(
        kv, providers=[], port=0, clock=clock, declared={"big:7b": 12 * 1024},
        runtime=RuntimeSettings().with_values({"default_latency_seconds": 5.0}),
        settings=GatewaySettings(wait_limit_seconds=0.0))
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url) as client:
            answer = await client.post("/api/chat", json={
                "model": "big:7b", "messages": HELLO, "stream": False})
    finally:
        await gateway.stop()
        await kv.close()
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "18"
    assert "retry in about 18 s" in answer.json()["error"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_class_reply_names_the_model_that_answered_on_both_routes(
        classes: ModelClassBook, make_emulator: Callable[..., OllamaEmulator],
        stream: bool) -> None:
    gateway = await start_gateway({"gpu-a": make_emulator()}, virtual=classes)
    try:
        oai = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
        if stream:
            chunks = [c async for c in await oai.chat.completions.create(
                model="smart", messages=HELLO, stream=True)]  # type: ignore[arg-type]
            assert {c.model for c in chunks} == {"medium:7b"}
        else:
            reply = await oai.chat.completions.create(
                model="smart", messages=HELLO)  # type: ignore[arg-type]
            assert reply.model == "medium:7b"
        native = await ollama.AsyncClient(host=gateway.url).chat(model="smart",
                                                                 messages=HELLO)
        assert native.model == "medium:7b"
    finally:
        await gateway.stop()
