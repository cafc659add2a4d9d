"""ModelClass virtual names through the gateway: listed, resolved, served."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import ollama
import openai
import pytest

from kubemoot.api.loader import load_bundle
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway.classes import ModelClassBook, runtime_candidates
from kubemoot.scheduling.model_class import ModelClassCandidates
from tests.gateway.conftest import start_gateway

BUNDLE = """
apiVersion: kubemoot.ai/v1alpha1
kind: Model
metadata: {name: small, labels: {size: small}}
spec: {model: "small:1b", providerRef: gpu-a, vramMib: 1000}
---
apiVersion: kubemoot.ai/v1alpha1
kind: Model
metadata: {name: medium, labels: {size: medium}}
spec: {model: "medium:7b", providerRef: gpu-a, vramMib: 4000}
---
apiVersion: kubemoot.ai/v1alpha1
kind: ModelClass
metadata: {name: smart}
spec:
  prefer: [{weight: 60, selector: {matchLabels: {size: medium}}}]
  tolerance: 0
---
apiVersion: kubemoot.ai/v1alpha1
kind: ModelClass
metadata: {name: anything}
spec:
  prefer: [{weight: 30, selector: {matchLabels: {size: medium}}}]
  tolerance: 50
"""


@pytest.fixture
def book(tmp_path: Path) -> ModelClassBook:
    path = tmp_path / "bundle.yaml"
    path.write_text(BUNDLE)
    bundle = load_bundle([path])
    return ModelClassBook(bundle.model_classes, bundle.models, bundle.providers,
                          runtime_tolerance=10.0)


def test_a_class_tolerance_becomes_the_runtimes(book: ModelClassBook) -> None:
    assert book.names() == ["anything", "smart"]
    smart = book.candidates("smart")
    assert smart is not None and [c.model for c in smart] == ["medium:7b"]
    anything = book.candidates("anything")
    assert anything is not None and [c.model for c in anything] == ["medium:7b", "small:1b"]
    # 30 points apart with a class tolerance of 50: inside the runtime's 10 once scaled
    assert anything[0].score - anything[1].score == pytest.approx(30 * 10 / 50)
    resolved = ModelClassCandidates("x", (("a", 60.0), ("b", 0.0)), "a", None)
    assert [c.score for c in runtime_candidates(resolved, 10.0)] == [60.0, 0.0]


async def test_classes_are_listed_and_served(
        book: ModelClassBook, make_emulator: Callable[..., OllamaEmulator]) -> None:
    gateway = await start_gateway({"gpu-a": make_emulator()}, virtual=book)
    try:
        client = ollama.AsyncClient(host=gateway.url)
        names = {m.model for m in (await client.list()).models}
        assert {"smart", "anything", "small:1b"} <= names
        oai = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
        assert "smart" in [m.id async for m in oai.models.list()]
        raw = await oai.chat.completions.with_raw_response.create(
            model="smart", messages=[{"role": "user", "content": "hi"}])
        assert raw.headers["x-kubemoot-model"] == "medium:7b"
        assert raw.parse().model == "medium:7b"  # the model that answered (docs/gateway.md)
        # small:1b is warm now: a class that tolerates it may take it instead of medium
        await client.chat(model="small:1b", messages=[{"role": "user", "content": "hi"}])
        reply = await client.chat(model="anything",
                                  messages=[{"role": "user", "content": "hi"}])
        assert reply.model in ("medium:7b", "small:1b")
    finally:
        await gateway.stop()


async def test_a_refusal_names_the_class_the_client_asked_for(
        book: ModelClassBook, make_emulator: Callable[..., OllamaEmulator]) -> None:
    """A refused call for a class used to name only the class's first model, a name the
    client never sent."""
    gateway = await start_gateway({"gpu-a": make_emulator()}, virtual=book)
    try:
        client = ollama.AsyncClient(host=gateway.url)
        with pytest.raises(ollama.ResponseError) as long:
            await client.chat(model="smart",
                              messages=[{"role": "user", "content": "word " * 5000}])
        assert long.value.status_code == 400
        assert 'model "smart" (medium:7b)' in long.value.error
        with pytest.raises(ollama.ResponseError) as plain:
            await client.chat(model="small:1b",
                              messages=[{"role": "user", "content": "word " * 5000}])
        assert 'for model "small:1b" (1024 tokens)' in plain.value.error  # just its name
    finally:
        await gateway.stop()
