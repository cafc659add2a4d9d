"""The dashboard's mirror of shared state: VRAM split, freshness, expiry, attribution."""

from __future__ import annotations

import pytest

from kubemoot.clock import ManualClock
from kubemoot.dashboard.fleet import RECENT_CALLS_PER_AGENT, FleetView
from kubemoot.store.documents import (
    MODEL_DEMAND_BUCKET,
    DemandEntry,
    SelectionEntry,
    Ticket,
    TicketState,
)
from kubemoot.store.keys import join_key
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import until_idle
from tests.dashboard.conftest import T0, Writers, call, state, ticket

LOADING, RUNNING, HELD = TicketState.LOADING, TicketState.RUNNING, TicketState.HELD


async def settle() -> None:
    await until_idle()  # the watch tasks delivered what was written


@pytest.mark.parametrize(
    ("loaded", "tickets", "resident", "loading", "free", "in_use"),
    [
        pytest.param({}, [], 0, 0, 32768 - 1024, 0, id="empty-card"),
        pytest.param({"qwen3:14b": 12288}, [], 12288, 0, 32768 - 1024 - 12288, 0,
                     id="one-resident"),
        pytest.param({"qwen3:14b": 12288}, [ticket("qwen3:14b", 0, RUNNING)],
                     12288, 0, 32768 - 1024 - 12288, 1, id="warm-call-spends-no-vram"),
        pytest.param({"qwen3:14b": 12288}, [ticket("qwen3:8b", 6144, LOADING)],
                     12288, 6144, 32768 - 1024 - 12288 - 6144, 1, id="cold-load-in-flight"),
        pytest.param({}, [ticket("qwen3:32b", 27648, HELD)], 0, 27648, 32768 - 1024 - 27648,
                     0, id="held-plan-counts-as-loading"),
        pytest.param({"qwen3:8b": 6144}, [ticket("qwen3:8b", 6144, LOADING)], 6144, 0,
                     32768 - 1024 - 6144, 1, id="loaded-copy-not-counted-twice"),
        pytest.param({"qwen3:32b": 27648}, [ticket("qwen3:14b", 12288, LOADING)], 27648,
                     12288, 0, 1, id="free-never-negative"),
        pytest.param({}, [ticket("qwen3:8b", 6144, LOADING, at=T0 - 200)], 0, 0,
                     32768 - 1024, 0, id="expired-ticket-ignored"),
    ],
)
async def test_dashboard_vram_split(
    kv: MemoryKV, clock: ManualClock, writers: Writers, loaded: dict[str, int],
    tickets: list[Ticket], resident: int, loading: int, free: int, in_use: int,
) -> None:
    await writers.put_state(state(loaded=loaded))
    await writers.put_tickets("gpu-a", *tickets)
    view = FleetView(kv, clock=clock)
    await view.start()
    try:
        [p] = view.snapshot()["providers"]
        assert (p["residentMiB"], p["loadingMiB"], p["freeMiB"]) == (resident, loading, free)
        assert p["slotsInUse"] == in_use
        assert p["totalVramMiB"] == 32768 and p["reserveMiB"] == 1024
    finally:
        await view.close()


@pytest.mark.parametrize(
    ("probed", "ready", "age", "stale"),
    [
        pytest.param(T0, True, 0.0, False, id="just-probed"),
        pytest.param(T0 - 119, True, 119.0, False, id="inside-freshness"),
        pytest.param(T0 - 121, True, 121.0, True, id="older-than-freshness"),
        pytest.param(None, True, None, False, id="declared-by-hand"),
        pytest.param(T0, False, 0.0, False, id="not-ready"),
    ],
)
async def test_dashboard_provider_freshness(
    kv: MemoryKV, clock: ManualClock, writers: Writers, probed: float | None, ready: bool,
    age: float | None, stale: bool,
) -> None:
    await writers.put_state(state(probed=probed, ready=ready,
                                  reason=None if ready else "connection refused"))
    view = FleetView(kv, clock=clock)
    await view.start()
    try:
        [p] = view.snapshot()["providers"]
        assert (p["ageSeconds"], p["stale"], p["ready"]) == (age, stale, ready)
        assert p["reason"] == (None if ready else "connection refused")
    finally:
        await view.close()


async def test_dashboard_unknown_total_leaves_free_unknown(
    kv: MemoryKV, clock: ManualClock, writers: Writers
) -> None:
    await writers.put_state(state(total=None, loaded={"qwen3:8b": 6144}))
    view = FleetView(kv, clock=clock)
    await view.start()
    try:
        [p] = view.snapshot()["providers"]
        assert p["freeMiB"] is None and p["residentMiB"] == 6144
    finally:
        await view.close()


async def test_dashboard_follows_changes_after_start(
    kv: MemoryKV, clock: ManualClock, writers: Writers
) -> None:
    view = FleetView(kv, clock=clock)
    await view.start()
    woken: list[int] = []
    view.on_change(lambda: woken.append(view.version))
    try:
        assert view.snapshot()["providers"] == []
        await writers.put_state(state("gpu-b", loaded={"qwen3:8b": 6144}))
        await writers.put_state(state("gpu-a"))
        await settle()
        assert [p["provider"] for p in view.snapshot()["providers"]] == ["gpu-a", "gpu-b"]
        await writers.delete_state("gpu-b")
        await settle()
        assert [p["provider"] for p in view.snapshot()["providers"]] == ["gpu-a"]
        assert len(woken) == 3 and woken == sorted(woken)
    finally:
        await view.close()


async def test_dashboard_call_log_summary(
    kv: MemoryKV, clock: ManualClock, writers: Writers
) -> None:
    await writers.put_call(call("crew/a", 1, provider="rtx4090", model="qwen3:8b"))
    view = FleetView(kv, clock=clock)
    await view.start()
    try:
        for n in range(2, 12):
            evicted = ("qwen3:8b",) if n == 5 else ()
            await writers.put_call(call("crew/a", n, provider="rtx5090", evicted=evicted))
        await writers.put_call(call("crew/b", 1, provider="rtx4090", phase="triage"))
        await settle()
        agents = {a["agent"]: a for a in view.snapshot()["agents"]}
        a = agents["crew/a"]
        assert a["calls"] == 11  # counted, though only the recent ones are kept
        assert a["evictions"] == 1
        assert a["waitedSeconds"] == pytest.approx(0.5 * sum(range(1, 12)))
        recent = a["recent"]
        assert len(recent) == RECENT_CALLS_PER_AGENT
        assert [c["threadId"] for c in recent] == [f"t-{n}" for n in range(11, 3, -1)]
        assert next(c for c in recent if c["threadId"] == "t-5")["evicted"] == ["qwen3:8b"]
        b = agents["crew/b"]
        assert (b["calls"], b["recent"][0]["provider"], b["recent"][0]["phase"]) == (
            1, "rtx4090", "triage")
    finally:
        await view.close()


async def test_dashboard_demand_ignores_expired_entries(
    kv: MemoryKV, clock: ManualClock
) -> None:
    bucket = await kv.bucket(MODEL_DEMAND_BUCKET)
    await bucket.put(join_key("wait", "qwen3:32b", "crew/a"),
                     DemandEntry(expires_at=T0 + 60).to_json())
    await bucket.put(join_key("intent", "qwen3:14b", "crew/b"),
                     DemandEntry(expires_at=T0 - 1).to_json())
    await bucket.put(join_key("use", "qwen3:8b"),
                     DemandEntry(expires_at=T0 + 60, count=2.5).to_json())
    await bucket.put(join_key("sel", "crew/a"),
                     SelectionEntry(expires_at=T0 + 60, models=["qwen3:32b"],
                                    frequency=0.5).to_json())
    view = FleetView(kv, clock=clock)
    await view.start()
    try:
        demand = view.snapshot()["demand"]
        by_kind = {d["kind"]: d for d in demand}
        assert set(by_kind) == {"wait", "use", "sel"}
        assert (by_kind["wait"]["model"], by_kind["wait"]["agent"]) == ("qwen3:32b", "crew/a")
        assert (by_kind["use"]["model"], by_kind["use"]["count"]) == ("qwen3:8b", 2.5)
        assert by_kind["sel"]["models"] == ["qwen3:32b"]
        clock.advance(61)
        assert [d["kind"] for d in view.snapshot()["demand"]] == []
    finally:
        await view.close()


async def test_dashboard_skips_unreadable_documents(
    kv: MemoryKV, clock: ManualClock, writers: Writers
) -> None:
    await writers.put_state(state("gpu-a"))
    states = await kv.bucket("kubemoot_provider_state")
    await states.put("broken", b'{"provider": 3')
    view = FleetView(kv, clock=clock)
    await view.start()
    try:
        assert [p["provider"] for p in view.snapshot()["providers"]] == ["gpu-a"]
    finally:
        await view.close()
