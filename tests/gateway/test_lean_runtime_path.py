"""What a forwarded call no longer pays for in the runtime and the call log.

Counted with cProfile (call counts, not times): the call log reads each record's
decision summary once, its entries wait in a deque rather than an asyncio.Queue, the
waiter copies a placement without ``dataclasses.replace``, the decision summary reads
no enum through its Python descriptor, the gateway's clock asks ``time.time`` without
a Python frame of its own, and closing a call shields its release without
``asyncio.shield``. The entries written are the calls answered.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
from collections.abc import Callable

import httpx

from kubemoot import metrics
from kubemoot.clock import SystemClock
from kubemoot.dashboard.calllog import CALL_LOG_BUCKET, CallEntry, CallLogWriter
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer
from kubemoot.settings import GatewaySettings
from kubemoot.store.memory import MemoryKV
from tests.gateway.conftest import sources

BODY = {"model": "small:1b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
CALLS = 3


def _calls(stats: pstats.Stats, path_end: str, name: str, *, caller: str = "") -> int:
    """How many times functions ``name`` defined in a file ending ``path_end`` were
    called (from a file ending ``caller``, when given)."""
    total = 0
    for (filename, _line, fn), entry in stats.stats.items():  # type: ignore[attr-defined]
        if fn != name or not filename.endswith(path_end):
            continue
        for (by, _l, _n), counts in entry[4].items():
            if by.endswith(caller):
                total += counts[1]
    return total


async def test_a_forwarded_call_pays_less_in_the_runtime_and_its_log_is_whole(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    kv = MemoryKV(SystemClock())
    writer = await CallLogWriter.open(kv)
    gateway = GatewayServer(
        kv, providers=sources({"gpu-a": make_emulator()}), port=0,
        settings=GatewaySettings(wait_limit_seconds=5.0, provider_probe_seconds=3600.0),
        on_call=[writer.record])
    await gateway.start()
    profile = cProfile.Profile()
    try:
        async with httpx.AsyncClient(base_url=gateway.url,
                                     timeout=30) as http:
            warm = await http.post("/api/chat", json=BODY)  # the load happens here
            assert warm.status_code == 200, warm.text
            await writer.flush()
            requests_before = metrics.REGISTRY.get_sample_value(
                "kubemoot_gateway_requests_total", {"route": "/api/chat", "status": "200"})
            profile.enable()
            try:
                for _ in range(CALLS):
                    answer = await http.post("/api/chat", json=BODY)
                    assert answer.status_code == 200, answer.text
                await asyncio.sleep(0.05)  # let the writer task write the last entry
            finally:
                profile.disable()
        await writer.flush()
        bucket = await kv.bucket(CALL_LOG_BUCKET)
        entries = [CallEntry.from_json(e.value) for key in await bucket.keys()
                   if (e := await bucket.get(key)) is not None]
    finally:
        await gateway.stop()
        await kv.close()
    stats = pstats.Stats(profile)
    # the access log adds to its counters through their values, and still counts
    assert _calls(stats, "prometheus_client/metrics.py", "inc", caller="gateway/access.py") == 0
    assert metrics.REGISTRY.get_sample_value(
        "kubemoot_gateway_requests_total", {"route": "/api/chat", "status": "200"}) == (
            (requests_before or 0) + CALLS)
    assert _calls(stats, "runtime/record.py", "call_decision") == CALLS
    assert _calls(stats, "dataclasses.py", "replace", caller="runtime/waiting.py") == 0
    assert _calls(stats, "asyncio/queues.py", "put_nowait", caller="calllog.py") == 0
    assert _calls(stats, "enum.py", "__get__", caller="runtime/record.py") == 0
    assert _calls(stats, "kubemoot/clock.py", "now") == 0
    # closing a call shields its release without asyncio.shield's and ensure_future's
    # Python; a call placed at once never asks for its task; one estimator per model
    assert _calls(stats, "asyncio/tasks.py", "shield", caller="runtime/calls.py") == 0
    assert _calls(stats, "asyncio/tasks.py", "ensure_future", caller="runtime/calls.py") == 0
    assert _calls(stats, "asyncio/tasks.py", "current_task", caller="runtime/calls.py") == 0
    assert _calls(stats, "runtime/tokens.py", "__init__", caller="runtime/calls.py") == 0
    # nothing the log keeps was lost: every call answered has its entry and decision
    assert len(entries) == CALLS + 1
    for entry in entries:
        assert entry.action in ("warm", "cold-load") and entry.ok
        assert entry.decision is not None and entry.decision["action"] == entry.action
        assert entry.decision["outcome"] == "PLACE" and entry.decision["options"]
