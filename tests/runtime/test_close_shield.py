"""Closing a call: its release goes on when the closer is cancelled, and is recorded
once it ends; what the release raises reaches the closer (as through asyncio.shield)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubemoot.clock import ManualClock
from kubemoot.runtime.calls import ActiveCall, CallRequest
from kubemoot.runtime.placement import Action, CallPlacement, CandidateModel


class _Service:
    """The part of CallService a call's close uses: the release waits for ``go``."""

    def __init__(self, fail: bool = False) -> None:
        self.clock = ManualClock()
        self.go = asyncio.Event()
        self.steps: list[str] = []
        self.fail = fail

    async def _before_release(self, call: ActiveCall) -> None:
        self.steps.append("before")

    async def _release(self, call: ActiveCall) -> None:
        self.steps.append("release started")
        await self.go.wait()
        if self.fail:
            raise RuntimeError("the release failed")
        self.steps.append("released")

    def _recorded(self, call: ActiveCall) -> None:
        self.steps.append("recorded")

    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()


def _call(service: _Service) -> ActiveCall:
    request = CallRequest(candidates=(CandidateModel("m"),), agent="a", thread_id="t",
                          phase="p")
    placement = CallPlacement(Action.WARM, provider="gpu", model="m")
    service_: Any = service
    return ActiveCall(service_, request, placement, holder="h", arrived=0.0, action="warm")


async def test_a_cancelled_closer_leaves_the_release_to_finish_and_be_recorded() -> None:
    service = _Service()
    closing = asyncio.create_task(_call(service).close(ok=True))
    while "release started" not in service.steps:
        await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert service.steps == ["before", "release started"]
    service.go.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert service.steps == ["before", "release started", "released", "recorded"]


async def test_a_close_waits_for_its_release_and_records_after_it() -> None:
    service = _Service()
    service.go.set()
    await _call(service).close(ok=True)
    assert service.steps == ["before", "release started", "released", "recorded"]


async def test_what_the_release_raises_reaches_the_closer() -> None:
    service = _Service(fail=True)
    service.go.set()
    with pytest.raises(RuntimeError, match="the release failed"):
        await _call(service).close(ok=True)
    assert service.steps == ["before", "release started"]
