"""Malformed bodies get Ollama's 400 with a JSON error, never a 500 or a traceback,
and no bad value poisons the engine's books for the requests after it (issue #12/13)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from kubemoot.emulation.server import OllamaEmulator
from tests.providers.conftest import SMALL

HI = [{"role": "user", "content": "hi"}]
CHAT = {"model": SMALL.name, "messages": HI, "stream": False}
NESTED = b'{"model": "small:1b", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


async def post(emulator: OllamaEmulator, path: str, content: bytes) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{emulator.url}{path}", content=content,
                               headers={"content-type": "application/json"})


def body(**fields: Any) -> bytes:
    return json.dumps({**CHAT, **fields}).encode()


BAD_BODIES = [
    pytest.param("/api/chat", body(tools=[1]), id="tools-of-numbers"),
    pytest.param("/api/chat", body(tools=[{"function": "f"}]), id="tool-function-string"),
    pytest.param("/api/chat", body(tools=[{"function": {"name": "f", "parameters": [1]}}]),
                 id="tool-parameters-list"),
    pytest.param("/api/chat", body(tools=[{"function": {"name": "f", "parameters": {
        "properties": {"a": 1}, "required": ["a"]}}}]), id="tool-property-number"),
    pytest.param("/api/chat", body(tools=[{"function": {"name": "f", "parameters": {
        "required": "a"}}}]), id="tool-required-string"),
    pytest.param("/api/chat", body(tools={"function": {}}), id="tools-object"),
    pytest.param("/api/chat", NESTED, id="deeply-nested-json"),
    pytest.param("/api/generate", b'{"model": "small:1b", "prompt": "x", "keep_alive": '
                 + b"9" * 400 + b"}", id="400-digit-keep-alive"),
    pytest.param("/api/generate", b'{"model": "small:1b", "keep_alive": -'
                 + b"9" * 400 + b"}", id="400-digit-negative-keep-alive"),
    pytest.param("/api/generate", body(keep_alive="1" * 400 + "s"),
                 id="400-digit-keep-alive-string"),
    pytest.param("/api/chat", body(keep_alive="nan"), id="keep-alive-nan"),
    pytest.param("/api/chat", body(keep_alive="inf"), id="keep-alive-inf"),
    pytest.param("/api/chat", b'{"model": "small:1b", "messages": [], "keep_alive": NaN}',
                 id="keep-alive-bare-nan"),
    pytest.param("/api/chat", body(options={"num_ctx": 10**400}), id="400-digit-num-ctx"),
    pytest.param("/api/chat", body(options={"num_ctx": True}), id="num-ctx-boolean"),
    pytest.param("/api/chat", body(options=[1]), id="options-list"),
    pytest.param("/api/chat", body(messages=[{"role": "user", "content": {"a": 1}}]),
                 id="content-object"),
    pytest.param("/api/chat", body(messages=[{"role": 7, "content": "x"}]), id="role-number"),
    pytest.param("/api/chat", body(truncate="no"), id="truncate-string"),
    pytest.param("/api/embed", body(input=[1, 2]), id="embed-input-numbers"),
    pytest.param("/api/embed", body(input="x", dimensions=0), id="embed-dimensions-zero"),
    pytest.param("/api/embeddings", body(prompt=["x"]), id="embeddings-prompt-list"),
    pytest.param("/v1/chat/completions", body(tools=[1]), id="openai-tools-of-numbers"),
    pytest.param("/v1/chat/completions", body(messages=[{"role": "user", "content": 5}]),
                 id="openai-content-number"),
    pytest.param("/v1/chat/completions", NESTED, id="openai-deeply-nested"),
    pytest.param("/v1/embeddings", body(input=[[1, 2]]), id="openai-token-arrays"),
    pytest.param("/v1/embeddings", body(input="x", encoding_format="hex"),
                 id="openai-encoding"),
]


@pytest.mark.parametrize(("path", "content"), BAD_BODIES)
async def test_malformed_bodies_are_400_with_a_json_error(
    emulator: OllamaEmulator, path: str, content: bytes,
) -> None:
    response = await post(emulator, path, content)
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    message = error["message"] if path.startswith("/v1/") else error
    assert isinstance(message, str) and message and "Traceback" not in message


async def test_a_nan_keep_alive_leaves_ps_working(emulator: OllamaEmulator) -> None:
    """``keep_alive: "nan"`` once made every later ``/api/ps`` fail until a restart."""
    assert (await post(emulator, "/api/chat", body())).status_code == 200
    refused = await post(emulator, "/api/chat", body(keep_alive="nan"))
    async with httpx.AsyncClient(timeout=10) as http:
        ps = await http.get(f"{emulator.url}/api/ps")
    assert refused.status_code == 400
    assert ps.status_code == 200 and [m["name"] for m in ps.json()["models"]] == [SMALL.name]
