"""A provider state older than its publisher's promise is STALE, not ready evidence.

The limit is the publisher's own: ``probeIntervalSeconds`` × (missed probes + 1) plus
one probe timeout after ``lastProbedAt``. A state that promises no interval (written
by hand, or by the simulator's publisher, which writes on every change) is taken as is.
"""

from __future__ import annotations

from kubemoot.gates.results import Outcome, Verdict
from kubemoot.runtime import filters
from kubemoot.runtime.freshness import MISSED_PROBES
from kubemoot.runtime.placement import Action
from kubemoot.runtime.refusals import Reason, StateStale
from kubemoot.settings import RuntimeSettings
from kubemoot.testing.state import NOW, gpu

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
