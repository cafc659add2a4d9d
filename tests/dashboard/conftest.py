"""Fixtures: a shared store with a few writers, a running dashboard, headless Chromium."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from kubemoot.clock import ManualClock, SystemClock
from kubemoot.dashboard.calllog import CALL_LOG_BUCKET, CallEntry
from kubemoot.dashboard.server import DashboardServer
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    ProviderState,
    ProviderTickets,
    Ticket,
    TicketState,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import provider_state
from kubemoot.testing.state import ticket as shared_ticket
from tests.ci import cannot_run

CHROMIUM = Path(os.environ.get("KUBEMOOT_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard"
T0 = 1_700_000_000.0


def state(
    provider: str = "gpu-a",
    *,
    total: int | None = 32768,
    loaded: dict[str, int] | None = None,
    probed: float | None = T0,
    ready: bool = True,
    reason: str | None = None,
    parallel: int = 2,
) -> ProviderState:
    """The dashboard's scene: two slots, probed at T0 (see kubemoot.testing.state)."""
    return provider_state(provider, total_mib=total, loaded=loaded, probed_at=probed,
                          ready=ready, reason=reason, slots=parallel)


def ticket(model: str, mib: int, st: TicketState, *, at: float = T0,
           tid: str | None = None) -> Ticket:
    return shared_ticket(model, footprint_mib=mib, state=st, now=at,
                         ident=tid or f"{model}-{st.value}-{at}", holder_id="crew/agent")


def call(agent: str, n: int, *, provider: str = "gpu-a", model: str = "qwen3:14b",
         evicted: tuple[str, ...] = (), phase: str = "mulling") -> CallEntry:
    return CallEntry(agent=agent, thread_id=f"t-{n}", phase=phase, model=model,
                     provider=provider, action="warm", waited_seconds=0.5 * n,
                     evicted=list(evicted), started_at=T0 + n, seconds=1.0)


class Writers:
    """Writes shared state the way the prober, the ticket manager and the demo do."""

    def __init__(self, kv: MemoryKV) -> None:
        self.kv = kv
        self._calls = 0

    async def put_state(self, doc: ProviderState) -> None:
        bucket = await self.kv.bucket(PROVIDER_STATE_BUCKET)
        await bucket.put(encode_token(doc.provider), doc.to_json())

    async def delete_state(self, provider: str) -> None:
        bucket = await self.kv.bucket(PROVIDER_STATE_BUCKET)
        await bucket.delete(encode_token(provider))

    async def put_tickets(self, provider: str, *tickets: Ticket) -> None:
        bucket = await self.kv.bucket(PROVIDER_TICKETS_BUCKET)
        doc = ProviderTickets(provider=provider, tickets=list(tickets))
        await bucket.put(encode_token(provider), doc.to_json())

    async def put_call(self, entry: CallEntry) -> None:
        bucket = await self.kv.bucket(CALL_LOG_BUCKET)
        self._calls += 1
        await bucket.put(f"{encode_token(entry.agent)}.test-{self._calls:06d}", entry.to_json())


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
async def kv(clock: ManualClock) -> AsyncIterator[MemoryKV]:
    store = MemoryKV(clock)
    yield store
    await store.close()


@pytest.fixture
def writers(kv: MemoryKV) -> Writers:
    return Writers(kv)


@pytest.fixture
async def live_kv() -> AsyncIterator[MemoryKV]:
    """A store on the wall clock, for a server a browser or HTTP client talks to."""
    store = MemoryKV(SystemClock())
    yield store
    await store.close()


@pytest.fixture
async def server(live_kv: MemoryKV) -> AsyncIterator[DashboardServer]:
    async with DashboardServer(live_kv, port=0, clock=SystemClock()) as running:
        yield running


# The flags the machine facts ask for; the fresh profile directory is passed as
# Playwright's user_data_dir (it refuses a --user-data-dir flag), which amounts to the same.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def no_browser(reason: str) -> NoReturn:
    """Skip a browser test on a developer's machine; fail it under ``CI=true``.

    A CI machine without Chromium would otherwise pass by testing less, silently (``.ci/run``
    installs Chromium, so there this can only mean the install went wrong).
    """
    cannot_run(reason)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """A browser context of Debian's Chromium, driven by Playwright, with a fresh profile.

    Without Chromium (not installed, or it does not start) the test skips, or fails
    under ``CI=true`` (:func:`no_browser`).
    """
    if not CHROMIUM.exists():
        no_browser(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError as error:
        no_browser(f"playwright is not installed: {error}")
    profile = tempfile.mkdtemp(prefix="kubemoot-dashboard-chromium-")
    try:
        async with async_playwright() as pw:
            try:
                context = await pw.chromium.launch_persistent_context(
                    profile, executable_path=str(CHROMIUM), headless=True,
                    args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900},
                )
            except Exception as error:  # any launch failure means "no browser here"
                no_browser(f"{CHROMIUM} did not start: {error}")
            try:
                yield context
            finally:
                await context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
