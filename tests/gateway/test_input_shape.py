"""Fault 4 (issue 22, the input side): a malformed body is a 400 naming the field,
answered before the call is placed, and a client that leaves mid-body is not an error.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import httpx
import pytest

from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import Fleet

USER = '{"role": "user", "content": "hi"}'


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/api/chat", f'{{"model": "small:1b", "messages": [{USER}], '
     '"options": {"temperature": NaN}}', "NaN is not a JSON number"),
    ("/api/chat", f'{{"model": "small:1b", "messages": [{USER}], '
     '"options": {"top_p": Infinity}}', "Infinity is not a JSON number"),
    ("/api/generate", '{"model": "small:1b", "prompt": "x", "seed": -Infinity}',
     "-Infinity is not a JSON number"),
    ("/v1/chat/completions", f'{{"model": "small:1b", "messages": [{USER}], '
     '"temperature": NaN}', "NaN is not a JSON number"),
    ("/api/chat", '{"model": "small:1b", "messages": [{"role": "assistant", "content": "",'
     ' "tool_calls": 5}]}', "messages[0].tool_calls must be a list"),
    ("/api/chat", '{"model": "small:1b", "messages": [{"role": "assistant", "content": "",'
     ' "tool_calls": [{"function": "x"}]}]}',
     "messages[0].tool_calls[0].function must be an object"),
    ("/api/chat", '{"model": "small:1b", "messages": [{"role": "assistant", "content": "",'
     ' "tool_calls": [{"function": {"name": 3}}]}]}',
     "messages[0].tool_calls[0].function.name must be a string"),
    ("/api/chat", '{"model": "small:1b", "messages": [{"role": "assistant", "content": "",'
     ' "tool_calls": [{"function": {"name": "f", "arguments": 7}}]}]}',
     "messages[0].tool_calls[0].function.arguments must be an object"),
    ("/api/chat", '{"model": "small:1b", "messages": [{"role": "user", "content": 5}]}',
     "messages[0].content must be a string"),
])
async def test_malformed_bodies_are_400_before_placing(
        fleet: Fleet, path: str, body: str, words: str) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        answer = await http.post(path, content=body.encode())
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        message = error["message"] if isinstance(error, dict) else error
        assert words in message
        assert fleet.finished.records == []  # never placed
        assert all(not e.records for e in fleet.emulators.values())
        ok = await http.post("/api/chat", json={
            "model": "small:1b", "stream": False, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "f", "arguments": {"a": 1}}}]},
                {"role": "tool", "content": "1"}]})
        assert ok.status_code == 200, ok.text  # well-formed tool calls still pass


async def test_a_client_that_leaves_mid_body_is_no_error(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kubemoot")
    where = urlsplit(fleet.url)
    assert where.hostname is not None and where.port is not None
    _reader, writer = await asyncio.open_connection(where.hostname, where.port)
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 400\r\n\r\n{\"model\": ")
    await writer.drain()
    guard = fleet.gateway.guard
    assert guard is not None
    await wait_until(lambda: guard.in_flight == 1, timeout=30, what="the request in")
    writer.close()
    await wait_until(lambda: guard.in_flight == 0, timeout=30, what="the request over")
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    lines = [r.getMessage() for r in caplog.records if r.name == "kubemoot.gateway.access"]
    assert any("POST /api/chat 499" in line for line in lines), lines


async def test_the_emulator_says_nothing_either_when_a_client_leaves_mid_body(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    emulator = fleet.emulators["gpu-a"]
    where = urlsplit(emulator.url)
    assert where.hostname is not None and where.port is not None
    server = emulator._server  # the emulator's uvicorn: its live requests are the event
    assert server is not None
    state = server.server_state
    # The gateway's prober keeps its own keep-alive connection to the emulator, so "no
    # connection at all" may never come: follow this test's connection and its task.
    earlier_connections, earlier_tasks = set(state.connections), set(state.tasks)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    writer.write(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 400\r\n\r\n{\"model\": ")
    await writer.drain()
    await wait_until(lambda: bool(set(state.tasks) - earlier_tasks), timeout=30,
                     what="the request begun")
    ours = (set(state.connections) - earlier_connections, set(state.tasks) - earlier_tasks)
    writer.close()
    await wait_until(lambda: not (ours[0] & set(state.connections))
                     and not (ours[1] & set(state.tasks)), timeout=30,
                     what="the emulator done with the request")
    await reader.read()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
