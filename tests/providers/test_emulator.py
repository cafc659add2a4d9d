"""The Ollama-API emulator's own behaviour, over HTTP and in its engine."""

from __future__ import annotations

import asyncio
import json
import math
import socket
from collections.abc import Callable
from typing import Any

import httpx
import ollama
import pytest

from kubemoot.clock import ManualClock
from kubemoot.emulation.card import (
    EmulatorEngine,
    EmulatorError,
    parse_keep_alive,
)
from kubemoot.emulation.server import EMULATOR_VERSION, EmulatorConfig, OllamaEmulator
from tests.providers.conftest import MEDIUM, SMALL, fast_config


async def post(emulator: OllamaEmulator, path: str, body: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(f"{emulator.url}{path}", json=body)


async def test_it_says_it_is_an_emulator(emulator: OllamaEmulator) -> None:
    async with httpx.AsyncClient() as http:
        version = (await http.get(f"{emulator.url}/api/version")).json()["version"]
        root = (await http.get(emulator.url)).text
    assert version == EMULATOR_VERSION and "emulator" in version
    assert "emulator" in root and "not Ollama" in root


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
async def test_on_ipv6_its_url_brackets_the_address() -> None:
    with OllamaEmulator(fast_config(), host="::1") as emulator:
        assert emulator.url.startswith("http://[::1]:")
        async with httpx.AsyncClient(timeout=10) as http:
            version = (await http.get(f"{emulator.url}/api/version")).json()["version"]
    assert version == EMULATOR_VERSION


async def test_the_official_client_streams_from_it(emulator: OllamaEmulator) -> None:
    client = ollama.AsyncClient(host=emulator.url)
    parts = [part async for part in await client.chat(
        model=SMALL.name, messages=[{"role": "user", "content": "hi"}], stream=True)]
    shown = await client.show(SMALL.name)
    await client.close()  # type: ignore[no-untyped-call]
    assert parts[-1].done and not any(part.done for part in parts[:-1])
    assert len(parts) > 2  # a real stream: a chunk per word, then the final one
    whole = await post(emulator, "/api/chat", {
        "model": SMALL.name, "messages": [{"role": "user", "content": "hi"}],
        "stream": False})
    assert "".join(p.message.content or "" for p in parts) == whole.json()["message"]["content"]
    assert shown.details is not None and shown.details.family == "emulated"


async def test_generate_with_a_prompt_answers_deterministically(
    emulator: OllamaEmulator,
) -> None:
    body = {"model": SMALL.name, "prompt": "why?", "system": "be brief", "stream": False}
    first, second = (await post(emulator, "/api/generate", body)).json(), \
        (await post(emulator, "/api/generate", body)).json()
    assert first["response"] == second["response"] and first["response"]
    assert first["done_reason"] == "stop"
    assert [m["role"] for m in emulator.records[0].messages] == ["system", "user"]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/api/chat", {"model": "missing:1b", "messages": []}, 404),
        ("/api/show", {"model": "missing:1b"}, 404),
        ("/api/chat", {"messages": []}, 400),
        ("/api/chat", {"model": SMALL.name, "messages": "hi"}, 400),
        ("/api/chat", {"model": SMALL.name, "messages": [], "options": {"num_ctx": -1}}, 400),
        ("/api/generate", {"model": SMALL.name, "keep_alive": "soon"}, 400),
        ("/api/generate", {"model": SMALL.name, "prompt": 7}, 400),
        ("/api/generate", [1, 2], 400),
    ],
)
async def test_bad_requests_get_ollama_style_errors(
    emulator: OllamaEmulator, path: str, body: Any, status: int,
) -> None:
    response = await post(emulator, path, body)
    assert response.status_code == status
    assert isinstance(response.json()["error"], str)


_FAULTABLE = [("GET", "/api/version"), ("GET", "/api/tags"), ("GET", "/api/ps"),
              ("POST", "/api/show"), ("POST", "/api/generate"), ("POST", "/api/chat"),
              ("POST", "/api/embed"), ("POST", "/api/embeddings"), ("GET", "/v1/models"),
              ("POST", "/v1/chat/completions"), ("POST", "/v1/embeddings")]


@pytest.mark.parametrize(("method", "path"), _FAULTABLE)
async def test_an_injected_failure_answers_once_on_each_api_route(
    emulator: OllamaEmulator, method: str, path: str,
) -> None:
    emulator.fail_next(503, path=path)
    body = {"model": SMALL.name, "prompt": "hi", "input": "hi",
            "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with httpx.AsyncClient(timeout=10) as http:
        faulted = await http.request(method, f"{emulator.url}{path}",
                                     json=body if method == "POST" else None)
        served = await http.request(method, f"{emulator.url}{path}",
                                    json=body if method == "POST" else None)
    assert faulted.status_code == 503 and "injected" in faulted.json()["error"]
    assert served.status_code == 200


@pytest.mark.parametrize("path", ["/", "/emulator/stats", f"/v1/models/{SMALL.name}"])
async def test_an_injected_failure_spares_the_routes_outside_the_api(
    emulator: OllamaEmulator, path: str,
) -> None:
    emulator.fail_next(503)  # whichever request comes next, except these
    async with httpx.AsyncClient(timeout=10) as http:
        spared = await http.get(f"{emulator.url}{path}")
        version = await http.get(f"{emulator.url}/api/version")
    assert spared.status_code == 200 and version.status_code == 503


async def test_keep_alive_zero_on_a_chat_unloads_after_it(emulator: OllamaEmulator) -> None:
    body = {"model": SMALL.name, "messages": [{"role": "user", "content": "x"}],
            "keep_alive": 0, "stream": False}
    assert (await post(emulator, "/api/chat", body)).status_code == 200
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{emulator.url}/api/ps")).json() == {"models": []}


async def test_forever_keep_alive_shows_a_far_future_expiry(emulator: OllamaEmulator) -> None:
    await post(emulator, "/api/generate", {"model": SMALL.name, "keep_alive": -1})
    async with httpx.AsyncClient() as http:
        [entry] = (await http.get(f"{emulator.url}/api/ps")).json()["models"]
    assert entry["expires_at"].startswith("2318")


async def test_a_load_waits_while_every_resident_model_is_busy(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator(vram_mib=3500, base_latency_s=20.0)  # one model at a time
    await post(emulator, "/api/generate", {"model": MEDIUM.name})
    chat = {"messages": [{"role": "user", "content": "go"}], "stream": False}
    busy = asyncio.create_task(post(emulator, "/api/chat", {"model": MEDIUM.name, **chat}))
    await emulator.until(lambda engine: MEDIUM.name in engine.peak_busy)
    waiting = await post(emulator, "/api/chat", {"model": SMALL.name, **chat})
    assert (await busy).status_code == 200 and waiting.status_code == 200
    by_model = {r.model: r for r in emulator.records}
    assert by_model[SMALL.name].queued and not by_model[MEDIUM.name].queued
    assert emulator.engine.evictions == [MEDIUM.name]  # only once it was idle


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, 300.0), (0, 0.0), (12, 12.0), (1.5, 1.5), ("90s", 90.0), ("5m", 300.0),
     ("1h", 3600.0), ("250ms", 0.25), ("-1", math.inf), (-1, math.inf), ("30", 30.0)],
)
def test_parse_keep_alive(value: object, seconds: float) -> None:
    assert parse_keep_alive(value, 300.0) == seconds


@pytest.mark.parametrize("value", ["soon", True, [1], "5x", "nan", "inf", "-inf",
                                   float("nan"), 10**400, -(10**400), "9" * 400 + "s"])
def test_parse_keep_alive_rejects(value: object) -> None:
    with pytest.raises(EmulatorError):
        parse_keep_alive(value, 300.0)


def _msg(role: str, chars: int) -> dict[str, str]:
    return {"role": role, "content": "x" * chars}


ENGINE = EmulatorEngine(EmulatorConfig(), clock=ManualClock())


@pytest.mark.parametrize(
    ("messages", "context", "kept_roles", "before", "evaluated", "dropped"),
    [
        pytest.param([_msg("user", 396)], 200, ["user"], 103, 103, 0, id="fits"),
        pytest.param([_msg("system", 36), _msg("user", 396), _msg("assistant", 396),
                      _msg("user", 396)], 200, ["system", "user"], 322, 116, 2,
                     id="oldest-dropped-system-kept"),
        pytest.param([_msg("user", 396), _msg("user", 396)], 150, ["user"], 206, 103, 1,
                     id="drop-until-fits"),
        pytest.param([_msg("user", 4000)], 512, ["user"], 1004, 512, 0,
                     id="newest-alone-is-cut"),
    ],
)
def test_truncation(messages: list[dict[str, str]], context: int, kept_roles: list[str],
                    before: int, evaluated: int, dropped: int) -> None:
    kept, fitted = ENGINE.truncate(messages, [], context)
    assert [m["role"] for m in kept] == kept_roles
    assert (fitted.tokens_sent, fitted.tokens, len(messages) - len(kept)) == (
        before, evaluated, dropped)
    assert kept[-1] is messages[-1]  # the newest message always stays


def test_tool_specs_count_toward_the_prompt() -> None:
    tools = [{"type": "function", "function": {"name": "t", "description": "d" * 400}}]
    without = ENGINE.truncate([_msg("user", 40)], [], 4096)[1].tokens_sent
    with_tools = ENGINE.truncate([_msg("user", 40)], tools, 4096)[1].tokens_sent
    assert with_tools - without == math.ceil(len(json.dumps(tools, sort_keys=True)) / 4)


def test_footprint_includes_the_kv_slab_for_every_slot() -> None:
    assert SMALL.footprint_mib(1024, 1) == 1008
    assert SMALL.footprint_mib(4096, 2) == 1064
    assert MEDIUM.footprint_mib(8192, 4) == 3000


def test_fast_config_is_what_the_tests_assume() -> None:
    config = fast_config()
    assert (config.vram_mib, config.context_length, config.time_scale) == (8192, 1024, 0.01)
