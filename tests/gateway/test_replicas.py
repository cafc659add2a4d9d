"""Two gateway processes sharing a real nats-server in front of two emulators.

Hundreds of concurrent requests over several models, spread over both replicas: each is
answered (200) or refused with a correct status, the engines never evict a model on
their own (every load was budgeted by a ticket in the shared bucket) and never cut a
prompt, and no ticket is left behind.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from kubemoot.dashboard.calllog import CALL_LOG_BUCKET, CALL_LOG_MAX_AGE_SECONDS, CallEntry
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.store import open_store
from kubemoot.store.documents import PROVIDER_TICKETS_BUCKET, ProviderTickets
from kubemoot.store.protocol import Entry
from kubemoot.testing.nats_server import NatsServer, free_port
from kubemoot.testing.waiting import until_stored, wait_until

pytestmark = pytest.mark.nats

KUBEMOOT = [sys.executable, "-c", "from kubemoot.cli import main; main()"]
MODELS = ("small:1b", "medium:7b", "plain:latest")


async def _serving(url: str, process: subprocess.Popen[bytes]) -> None:
    """Wait until the gateway process answers on ``url`` (it sends no other signal)."""
    async with httpx.AsyncClient(base_url=url) as http:
        async def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the gateway exited with {process.returncode}")
            try:
                return (await http.get("/")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(up, timeout=60, what=f"the gateway serving on {url}")


def _holders(entry: Entry | None) -> list[str]:
    return [] if entry is None else [
        t.holder_id for t in ProviderTickets.from_json(entry.value).tickets]


async def _tickets(nats_url: str) -> list[str]:
    """The holders of every ticket in the shared state, expired or not."""
    kv = await open_store(nats_url)
    try:
        bucket = await kv.bucket(PROVIDER_TICKETS_BUCKET)
        return [h for key in await bucket.keys() for h in _holders(await bucket.get(key))]
    finally:
        await kv.close()


async def _until_tickets(nats_url: str, *, held: bool, what: str) -> None:
    """Wait, on a watch of the shared tickets, until some are held (or none are)."""
    kv = await open_store(nats_url)
    try:
        bucket = await kv.bucket(PROVIDER_TICKETS_BUCKET)

        async def reached() -> bool:
            holders = [h for key in await bucket.keys() for h in _holders(await bucket.get(key))]
            return bool(holders) == held

        await until_stored(bucket, reached, timeout=30, what=what)
    finally:
        await kv.close()


async def _call_log(nats_url: str, *, at_least: int) -> list[CallEntry]:
    """The call-log entries once ``at_least`` are in (the gateways write them in the
    background)."""
    kv = await open_store(nats_url)
    try:
        bucket = await kv.bucket(CALL_LOG_BUCKET, max_age=CALL_LOG_MAX_AGE_SECONDS)

        async def written() -> list[str] | None:
            keys = await bucket.keys()
            return keys if len(keys) >= at_least else None

        keys = await until_stored(bucket, written, timeout=30,
                                  what=f"{at_least} entries in the call log")
        entries = []
        for key in keys:
            entry = await bucket.get(key)
            if entry is not None:
                entries.append(CallEntry.from_json(entry.value))
        assert len(entries) >= at_least
        return entries
    finally:
        await kv.close()


async def test_two_replicas_on_nats_never_overcommit(
        nats: NatsServer, make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulators = {"gpu-a": make_emulator(), "gpu-b": make_emulator()}
    ports = [free_port(), free_port()]
    card = "vramMiB=8192,numParallel=2,contextLength=1024,reserveMiB=512"
    providers = [a for name, e in emulators.items()
                 for a in ("--provider", f"{name}={e.url},{card}")]
    env = {**os.environ, "KUBEMOOT_DEBUG": "0"}
    processes = [subprocess.Popen(
        [*KUBEMOOT, "gateway", "--nats", nats.url, *providers,
         "--listen", f"127.0.0.1:{port}", "--wait-limit", "120s", "--probe-interval", "1s"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        await asyncio.gather(*(_serving(u, p) for u, p in zip(urls, processes, strict=True)))
        limits = httpx.Limits(max_connections=400)
        async with httpx.AsyncClient(timeout=180, limits=limits) as http:
            async def one(i: int) -> tuple[int, str]:
                body = {"model": MODELS[i % len(MODELS)], "stream": i % 2 == 0,
                        "messages": [{"role": "user", "content": f"question {i}"}]}
                answer = await http.post(f"{urls[i % 2]}/api/chat", json=body)
                if answer.status_code == 503:
                    assert int(answer.headers["retry-after"]) >= 1
                elif answer.status_code == 200:
                    assert answer.headers["x-kubemoot-model"] == body["model"]
                    assert answer.headers["x-kubemoot-provider"] in emulators
                return answer.status_code, answer.text

            answers = await asyncio.gather(*(one(i) for i in range(300)))
            statuses = Counter(status for status, _ in answers)
            assert set(statuses) <= {200, 503}, [t for s, t in answers
                                                 if s not in (200, 503)]
            assert statuses[200] >= 150, statuses
            for name, emulator in emulators.items():
                stats = (await http.get(f"{emulator.url}/emulator/stats")).json()
                assert stats["evictions"] == 0, f"{name} evicted on its own: {stats}"
                assert stats["truncations"] == 0, f"{name} cut a prompt: {stats}"
                assert stats["peakVramMiB"] <= stats["vramMiB"]
        assert await _tickets(nats.url) == []
        # every answered call reaches the call log the dashboard reads, attributed
        entries = await _call_log(nats.url, at_least=statuses[200])
        assert {(e.agent, e.provider in emulators, e.ok) for e in entries} == {
            ("anonymous", True, True)}
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
