"""A provider state older than its publisher's promise is STALE, not ready evidence.

The limit is the publisher's own: ``probeIntervalSeconds`` × (missed probes + 1) plus
one probe timeout after ``lastProbedAt``. A state that promises no interval (written
by hand, or by the simulator's publisher, which writes on every change) is taken as is.
"""

from __future__ import annotations

import asyncio

from kubemoot import metrics
from kubemoot.gates.results import Outcome, Verdict
from kubemoot.runtime import filters
from kubemoot.runtime.freshness import MISSED_PROBES
from kubemoot.runtime.placement import Action
from kubemoot.runtime.refusals import Reason, StateStale
from kubemoot.runtime.waiting import CapacityWaiter
from kubemoot.settings import RuntimeSettings
from kubemoot.testing.state import NOW, gpu
from tests.runtime.builders import candidates
from tests.runtime.test_waiting import Signals

SETTINGS = RuntimeSettings(probe_timeout_seconds=10.0)
INTERVAL = 5.0
LIMIT = (MISSED_PROBES + 1) * INTERVAL + 10.0


def card(probed_at: float, interval: float | None = INTERVAL) -> object:
    state = gpu("a", 16, residents={"small": 2})
    state.last_probed_at = probed_at
    state.probe_interval_seconds = interval
    return state


async def test_a_state_past_its_limit_is_stale_and_the_call_defers(make) -> None:
    h = await make([card(NOW)], declared={"small": 2, "big": 8}, settings=SETTINGS)
    warm = await h.place("small")
    assert warm.action is Action.WARM
    await h.planner.release(warm)

    h.clock.advance(LIMIT + 1)  # nothing published since: the same document, older
    fleet = await h.view.snapshot()
    (p,) = fleet.providers
    gate = filters.ready_gate(p)
    assert gate.result is Verdict.STALE, gate
    assert gate.evidence["maxAgeSeconds"] == LIMIT

    for model in ("small", "big"):  # neither the warm copy nor a cold load
        refused = await h.place(model)
        assert refused.action is Action.WAIT, refused  # not known impossible: DEFER
        assert refused.explanation is not None
        assert refused.explanation.outcome is Outcome.DEFER
        assert isinstance(refused.refusal, StateStale)
        assert refused.refusal.reason is Reason.STATE_STALE
        assert refused.refusal.providers == ("a",)
        (age,) = refused.refusal.ages()
        assert age == LIMIT + 1

    await h.set_state(card(h.clock.now()))  # a probe again: fresh evidence
    placed = await h.place("small")
    assert placed.action is Action.WARM, placed


async def test_the_view_turns_a_state_stale_without_any_write(make) -> None:
    h = await make([card(NOW)], declared={"small": 2}, settings=SETTINGS)
    await h.view.snapshot()
    h.clock.advance(LIMIT - 0.5)
    assert (await h.view.snapshot()).providers[0].state.ready
    h.clock.advance(1.0)  # the same documents: only their age changed
    assert not (await h.view.snapshot()).providers[0].state.ready


async def test_a_state_without_a_promised_interval_is_taken_as_is(make) -> None:
    h = await make([card(NOW - 86_400, interval=None)], declared={"small": 2},
                   settings=SETTINGS)
    placed = await h.place("small")
    assert placed.action is Action.WARM, placed


def _refusals(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("kubemoot_refusals_total", {"reason": reason})
    return 0.0 if value is None else value


async def test_a_call_waiting_on_stale_states_says_so_and_is_counted_so(make) -> None:
    """The wait for a fresh probe is signalled, and its give-up counted, as state-stale:
    no GPU was busy (both said gpu-busy)."""
    h = await make([card(NOW)], declared={"small": 2}, settings=SETTINGS)
    h.clock.advance(LIMIT + 1)
    watch = await h.watch()
    done = asyncio.Event()
    signals = Signals()
    waiter = CapacityWaiter(h.planner, clock=h.clock, watch=watch, board=h.board)
    stale, busy = _refusals("state-stale"), _refusals("gpu-busy")
    task = asyncio.create_task(
        waiter.place(candidates("small"), agent="crew/a", signals=signals, done=done))
    await asyncio.wait_for(signals.waits.wait(), 30)
    assert signals.seen == [("waiting", "small", "state-stale")]
    done.set()  # the discussion ends before any probe comes back
    placement = await asyncio.wait_for(task, 30)
    assert placement.reason == "state-stale"
    assert (_refusals("state-stale"), _refusals("gpu-busy")) == (stale + 1, busy)
    # with no watch the call gives up at once, counted the same way
    alone = CapacityWaiter(h.planner, clock=h.clock, watch=None)
    assert (await alone.place(candidates("small"), agent="crew/b")).reason == "state-stale"
    assert (_refusals("state-stale"), _refusals("gpu-busy")) == (stale + 2, busy)
