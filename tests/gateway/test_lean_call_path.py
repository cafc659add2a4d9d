"""What a forwarded call no longer pays for, and that nothing it did is lost.

A call answered before ``_WATCH_AFTER_SECONDS`` starts no task to watch for its client
leaving, and no call starts a task to close the engine's answer (closing never waits).
A client that leaves a call still going is noticed as before (the leaving-client tests
of test_release_paths.py run with the real delay). The reply of a whole
answer carries the same decision headers Starlette would have encoded, and the access
log still reads decision headers whatever their case. A gateway process freezes what it
built before serving and raises the collector's threshold.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine, Generator
from typing import Any

import httpx
import pytest
from starlette.responses import Response

from kubemoot.gateway import app as gateway_app
from kubemoot.gateway.access import AccessLog
from kubemoot.gateway.calls import PlacedCall
from kubemoot.gateway.jsoncodec import RawJsonReply
from tests.gateway.conftest import Fleet, live_tickets

BODY = {"model": "small:1b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def fleet(quiet_card: Fleet) -> Fleet:
    """One card, probed at start-up only (conftest's quiet_card)."""
    return quiet_card


def _started_tasks() -> list[str]:
    """The qualified names of the coroutines every task started from now on runs."""
    loop = asyncio.get_running_loop()
    names: list[str] = []
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop,
                coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
                **kwargs: Any) -> asyncio.Future[Any]:
        names.append(getattr(coro, "__qualname__", type(coro).__name__))
        if previous is not None:
            return previous(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    return names


async def test_a_call_answered_at_once_starts_no_watcher_and_no_closing_task(
        fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    # a long delay: no call of this test runs that long, however loaded the machine
    monkeypatch.setattr(gateway_app, "_WATCH_AFTER_SECONDS", 3600.0)
    async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as http:
        warm = await http.post("/api/chat", json=BODY)  # the load happens here
        assert warm.status_code == 200, warm.text
        names = _started_tasks()
        try:
            for path, body in (("/api/chat", BODY),
                               ("/v1/chat/completions", {**BODY, "stream": False})):
                answer = await http.post(path, json=body)
                assert answer.status_code == 200, answer.text
        finally:
            asyncio.get_running_loop().set_task_factory(None)
    assert names, "no task was seen at all: the factory did not take"
    assert not [n for n in names if "watch_disconnect" in n], names
    assert not [n for n in names if "close_upstream" in n], names
    await fleet.finished.until(3)
    assert await live_tickets(fleet.gateway) == []


def test_raw_decision_headers_are_what_starlette_would_send() -> None:
    class Placement:
        provider, model, evicted = "gpu-a", "small:1b", ["big:70b", "mid:8b"]

    class Active:
        action, waited_seconds, placement_seconds = "warm", 0.0123456, 1.5
        placement = Placement()

    call = PlacedCall.__new__(PlacedCall)
    call.placement, call.active = Placement(), Active()  # type: ignore[assignment]
    body = b'{"done":true}'
    ours = RawJsonReply(body, call.raw_headers())
    theirs = Response(body, media_type="application/json", headers=call.headers())
    assert sorted(ours.raw_headers) == sorted(theirs.raw_headers)
    assert ours.body == theirs.body and ours.status_code == theirs.status_code == 200


async def test_the_access_log_reads_decision_headers_in_any_case() -> None:
    seen: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"X-Kubemoot-Provider", b"gpu-z"),
            (b"x-kubemoot-MODEL", b"m:1b")]})
        await send({"type": "http.response.body", "body": b'{"eval_count": 7}'})

    log = AccessLog(app, on_outcome=seen.append)
    decisions: list[dict[bytes, bytes]] = []
    original = log._count

    def count(scope: Any, status: int, decision: dict[bytes, bytes], *rest: Any) -> None:
        decisions.append(dict(decision))
        original(scope, status, decision, *rest)

    log._count = count  # type: ignore[method-assign]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    scope = {"type": "http", "method": "POST", "path": "/api/chat", "headers": []}
    await log(scope, receive, send)
    assert decisions == [{b"provider": b"gpu-z", b"model": b"m:1b"}]


async def test_the_access_log_decodes_the_provider_alone_unless_it_writes_a_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """Every call's metrics need the provider's name; the model, the action and the
    wait are read only for the INFO line, so only then are they decoded."""
    import cProfile
    import logging
    import pstats

    headers = [(b"content-length", b"17"), (b"content-type", b"application/json"),
               (b"x-kubemoot-provider", b"gpu-q"), (b"x-kubemoot-model", b"m:1b"),
               (b"x-kubemoot-action", b"warm"), (b"x-kubemoot-wait-seconds", b"0.004"),
               (b"x-kubemoot-placement-seconds", b"0.001")]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"eval_count": 7}'})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    log = AccessLog(app)
    scope = {"type": "http", "method": "POST", "path": "/api/chat", "headers": []}
    await log(dict(scope), receive, send)  # the metric children are looked up once
    profile = cProfile.Profile()
    with caplog.at_level(logging.WARNING, logger="kubemoot.gateway.access"):
        profile.enable()
        try:
            for _ in range(3):
                await log(dict(scope), receive, send)
        finally:
            profile.disable()
    decoded = sum(entry[4].get(caller, (0, 0))[1]
                  for (_f, _l, fn), entry in pstats.Stats(profile).stats.items()  # type: ignore[attr-defined]
                  if fn == "<method 'decode' of 'bytes' objects>"
                  for caller in entry[4] if caller[0].endswith("gateway/access.py"))
    assert decoded == 3  # the provider, once per call (main decoded every decision header)
    with caplog.at_level(logging.INFO, logger="kubemoot.gateway.access"):
        await log(dict(scope), receive, send)
    line = caplog.records[-1].getMessage()
    assert "provider=gpu-q model=m:1b action=warm wait=0.004s" in line and "tokens=?+7" in line


def test_a_gateway_process_freezes_what_it_built_and_collects_less_often() -> None:
    from kubemoot.gateway.server import COLLECTION_THRESHOLD, collect_less

    before = gc.get_threshold()
    try:
        collect_less()
        assert gc.get_freeze_count() > 0  # what was built is left out of every pass
        assert gc.get_threshold() == (COLLECTION_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
