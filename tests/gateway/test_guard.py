"""Fault 5 (issue 22): a web page cannot drive a gateway on the user's machine.

A foreign ``Origin`` (CSRF: a ``text/plain`` POST needs no preflight) and a foreign
``Host`` (DNS rebinding) are refused with 403 before any call is placed; loopback
origins, origins given with ``allow_origins`` and clients that send no ``Origin`` (the
official libraries, curl) work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings
from kubemoot.webguard import host_allowed, origin_allowed
from tests.gateway.conftest import Fleet, start_gateway

CHAT = b'{"model": "small:1b", "messages": [{"role": "user", "content": "hi"}], "stream": false}'


@pytest.mark.parametrize(("origin", "allowed", "ok"), [
    ("http://localhost:3000", (), True),
    ("http://127.0.0.1", (), True),
    ("https://[::1]:8443", (), True),
    ("https://evil.example", (), False),
    ("http://127.0.0.1.evil.example", (), False),
    ("null", (), False),
    ("file://", (), False),
    ("https://app.example.com", ("https://app.example.com",), True),
    ("https://x.example.com", ("https://*.example.com",), True),
    ("https://example.com.evil", ("https://*.example.com",), False),
    ("https://anything.example", ("*",), True),
])
def test_origin_table(origin: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert origin_allowed(origin, allowed=allowed) is ok


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1:11435", True), ("localhost", True), ("[::1]:1", True),
    ("192.168.1.5:11435", True), ("gw.lan:11435", True), ("evil.example", False),
    ("", False),
])
def test_host_table(host: str, ok: bool) -> None:
    assert host_allowed(host, allowed=("gw.lan",)) is ok


async def test_a_cross_site_text_plain_post_is_refused_before_placing(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        answer = await http.post("/api/chat", content=CHAT, headers={
            "Origin": "https://evil.example", "Content-Type": "text/plain"})
        assert answer.status_code == 403, answer.text
        assert "--allow-origin" in answer.json()["error"]
        assert "access-control-allow-origin" not in answer.headers
        openai = await http.post("/v1/chat/completions", content=CHAT, headers={
            "Origin": "https://evil.example", "Content-Type": "text/plain"})
        assert openai.status_code == 403
        assert openai.json()["error"]["code"] == "forbidden_origin"
        # nothing reached an engine
        assert fleet.finished.records == []
        assert all(not e.records for e in fleet.emulators.values())


async def test_a_rebound_host_name_is_refused(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        for path in ("/api/tags", "/api/kubemoot/providers", "/"):
            answer = await http.get(path, headers={"Host": "evil.example"})
            assert answer.status_code == 403, path
        post = await http.post("/api/chat", content=CHAT, headers={"Host": "evil.example"})
        assert post.status_code == 403
    assert fleet.finished.records == []


async def test_loopback_origins_and_plain_clients_work_and_get_cors(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        plain = await http.post("/api/chat", content=CHAT)  # no Origin: not a browser
        assert plain.status_code == 200, plain.text
        browser = await http.post("/api/chat", content=CHAT,
                                  headers={"Origin": "http://localhost:5173"})
        assert browser.status_code == 200, browser.text
        assert browser.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert "X-Kubemoot-Provider" in browser.headers["access-control-expose-headers"]
        preflight = await http.options("/v1/chat/completions", headers={
            "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 204
        assert "POST" in preflight.headers["access-control-allow-methods"]


@pytest.fixture
async def allowing(make_emulator: Callable[..., OllamaEmulator]
                   ) -> AsyncIterator[GatewayServer]:
    settings = GatewaySettings(wait_limit_seconds=5.0,
                               allowed_origins=("https://chat.example.org",),
                               allowed_hosts=("gw.example.org",))
    gateway = await start_gateway({"gpu-a": make_emulator()}, settings=settings)
    try:
        yield gateway
    finally:
        await gateway.stop()


async def test_origins_and_hosts_given_by_the_operator_are_allowed(
        allowing: GatewayServer) -> None:
    async with httpx.AsyncClient(base_url=allowing.url) as http:
        answer = await http.post("/api/chat", content=CHAT, headers={
            "Origin": "https://chat.example.org", "Host": "gw.example.org:11435"})
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == "https://chat.example.org"
        other = await http.post("/api/chat", content=CHAT,
                                headers={"Origin": "https://other.example.org"})
        assert other.status_code == 403


async def test_each_host_is_judged_alike_every_time_and_made_up_hosts_stay_bounded() -> None:
    """The guard remembers its judgment of each Host header (a client sends the same one
    on every request); the judgment is the same as the first, and a client inventing
    Host headers cannot grow what it remembers past its bound."""
    from kubemoot.gateway import guard as guard_module
    from kubemoot.gateway.guard import Guard, GuardPolicy

    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = Guard(app, GuardPolicy(allowed_hosts=("gw.lan",)))
    statuses: list[int] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def request(host: str, path: str = "/api/tags") -> int:
        scope = {"type": "http", "method": "GET", "path": path,
                 "headers": [(b"host", host.encode())]}
        await guard(scope, receive, send)
        return statuses[-1]

    for _ in range(3):
        assert await request("gw.lan:11435") == 200
        assert await request("evil.example") == 403
        assert await request("127.0.0.1:11435") == 200
    for index in range(3 * guard_module._HOSTS_KEPT):
        assert await request(f"made-up-{index}.example") == 403
    assert len(guard._hosts) <= guard_module._HOSTS_KEPT
    assert await request("evil.example") == 403
    assert await request("gw.lan") == 200
    assert reached == ["/api/tags"] * 7  # the allowed ones only
