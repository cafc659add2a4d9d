"""``options.num_ctx`` never makes the engine load memory no ticket holds (DESIGN §9).

The emulated card sizes each copy by its context (``kv_mib_per_1k_tokens``), reloads a
copy asked for another ``num_ctx``, and counts in ``/emulator/stats`` the models it had
to push out on its own (``evictions``) and the copies it reloaded (``reloads``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import ollama
import pytest

from kubemoot.emulation.server import EmulatedModel, OllamaEmulator
from tests.gateway.conftest import MEDIUM, start_gateway

# 2000 MiB of weights and 100 MiB of KV cache per 1024 tokens of each of the card's two
# slots: 2200 MiB at the providers' context of 1024, 5200 MiB at a num_ctx of 16384.
SLAB = EmulatedModel("slab:3b", 2000, kv_mib_per_1k_tokens=100.0, family="slab")
BIG_CTX = 16384
HELLO = [{"role": "user", "content": "hello there"}]


async def stats(emulator: OllamaEmulator) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{emulator.url}/emulator/stats")
    answer.raise_for_status()
    body: dict[str, Any] = answer.json()
    return body


@pytest.fixture
def card(make_emulator: Callable[..., OllamaEmulator]) -> OllamaEmulator:
    return make_emulator(models=(SLAB, MEDIUM))


async def test_a_larger_num_ctx_on_a_load_does_not_push_out_a_warm_model(
        card: OllamaEmulator) -> None:
    """medium:7b (4000 MiB) is warm; loading slab:3b at the card's context fits beside
    it (6200 of 7680 usable MiB), at num_ctx 16384 it would not (9200 MiB). The ticket
    sized the load at the provider's context, so the engine must get that, and must
    not evict medium:7b to make room for a cache nobody budgeted."""
    gateway = await start_gateway({"gpu-a": card})
    try:
        client = ollama.AsyncClient(host=gateway.url)
        await client.chat(model="medium:7b", messages=HELLO)
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            answer = await http.post("/api/chat", json={
                "model": "slab:3b", "messages": HELLO, "stream": False,
                "options": {"num_ctx": BIG_CTX}})
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Kubemoot-Action"] == "cold-load"
        seen = await stats(card)
        assert (seen["evictions"], seen["reloads"]) == (0, 0), seen
        assert seen["loadsByModel"] == {"medium:7b": 1, "slab:3b": 1}
        assert seen["peakVramMiB"] == 4000 + 2200
        assert [r.num_ctx for r in card.records] == [None, None]
    finally:
        await gateway.stop()


async def test_another_num_ctx_on_a_warm_copy_never_reloads_it(card: OllamaEmulator) -> None:
    """slab:3b is warm at the card's context: a call asking a larger num_ctx runs on it
    as loaded; one asking exactly the loaded context keeps its option (it changes
    nothing), and the engine reloads nothing."""
    gateway = await start_gateway({"gpu-a": card})
    try:
        client = ollama.AsyncClient(host=gateway.url)
        await client.chat(model="slab:3b", messages=HELLO)
        for num_ctx in (BIG_CTX, 512, 1024):
            reply = await client.chat(model="slab:3b", messages=HELLO,
                                      options={"num_ctx": num_ctx})
            assert reply.done
        seen = await stats(card)
        assert (seen["loads"], seen["reloads"], seen["evictions"]) == (1, 0, 0), seen
        assert [r.num_ctx for r in card.records] == [None, None, None, 1024]
        assert {r.context_length for r in card.records} == {1024}
    finally:
        await gateway.stop()


async def test_a_prompt_only_a_larger_num_ctx_holds_is_refused_naming_the_option(
        card: OllamaEmulator) -> None:
    """No provider runs slab:3b with a context that holds this prompt; loading one at
    the client's num_ctx would take a cache no ticket sized, so the answer is a 400
    that names options.num_ctx, and nothing reaches the engine."""
    gateway = await start_gateway({"gpu-a": card})
    try:
        client = ollama.AsyncClient(host=gateway.url)
        with pytest.raises(ollama.ResponseError) as error:
            await client.chat(model="slab:3b",
                              messages=[{"role": "user", "content": "word " * 3000}],
                              options={"num_ctx": 65536})
        assert error.value.status_code == 400
        assert "1024 tokens" in error.value.error
        assert "options.num_ctx (65536)" in error.value.error
        seen = await stats(card)
        assert (seen["requests"], seen["loads"]) == (0, 0), seen
    finally:
        await gateway.stop()
