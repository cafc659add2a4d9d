"""Where a call's wait went: the split by phase adds up, and each part is the right one."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.sim import load_scenario, simulate
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.phases import CURRENT_CALL, WaitPhases, WaitSource, compare_calls
from kubemoot.sim.vloop import run_virtual

SIZES = {"big": 20480, "mid": 10240, "small": 4096}


def _gpu(vram_mib: int = 24576) -> EmulatedGpu:
    return EmulatedGpu("g", sizes_mib=SIZES, vram_mib=vram_mib, max_parallel=1,
                       keep_alive_seconds=300.0)


async def _call(gpu: EmulatedGpu, model: str, duration: float,
                *, delay: float = 0.0) -> WaitPhases:
    await asyncio.sleep(delay)
    phases = WaitPhases(asyncio.get_running_loop().time())
    CURRENT_CALL.set(phases)
    await gpu.serve(model, duration)
    return phases


def test_a_cold_call_waits_for_its_load_and_the_second_for_a_slot() -> None:
    async def main() -> list[WaitPhases]:
        gpu = _gpu()
        result = await asyncio.gather(_call(gpu, "mid", 5.0), _call(gpu, "mid", 5.0))
        await gpu.close()
        return list(result)

    first, second = run_virtual(main())
    # 10 GiB at 1 GiB/s: both wait 10 s for the load; the second then 5 s for the slot.
    assert first.split() == {"slot": 0.0, "load": 10.0, "eviction": 0.0, "memory": 0.0,
                             "prefill": 0.0}
    assert second.split() == {"slot": 5.0, "load": 10.0, "eviction": 0.0, "memory": 0.0,
                             "prefill": 0.0}


def test_time_in_the_engine_queue_while_a_model_unloads_is_eviction() -> None:
    async def main() -> WaitPhases:
        gpu = _gpu(vram_mib=1024 + 20480)
        await gpu.serve("mid", 1.0)  # resident and idle from 11 s
        phases = await _call(gpu, "big", 1.0)  # must push mid out first (1 s unload)
        await gpu.close()
        return phases

    phases = run_virtual(main())
    assert phases.split() == {"slot": 0.0, "load": 20.0, "eviction": 1.0, "memory": 0.0,
                             "prefill": 0.0}


def test_a_policy_that_unloads_before_sending_is_charged_eviction() -> None:
    async def main() -> WaitPhases:
        gpu = _gpu(vram_mib=1024 + 20480)
        await gpu.serve("mid", 1.0)
        phases = WaitPhases(asyncio.get_running_loop().time())
        CURRENT_CALL.set(phases)
        await gpu.unload("mid")  # what the runtime's unload plan does
        await gpu.serve("big", 1.0)
        await gpu.close()
        return phases

    phases = run_virtual(main())
    assert phases.split() == {"slot": 0.0, "load": 20.0, "eviction": 1.0, "memory": 0.0,
                             "prefill": 0.0}


def test_time_before_the_engine_is_a_slot_wait_only_when_it_ended_on_a_warm_copy() -> None:
    phases = WaitPhases(issued=0.0, engine_request=4.0, engine_assigned=4.0,
                        runner_ready=4.0, started=4.0)
    assert phases.split()["memory"] == 4.0
    phases.joined_warm = True
    assert phases.split()["slot"] == 4.0


@pytest.mark.parametrize("scenario", ["homelab", "burst-fanout"])
def test_every_policy_s_parts_add_up_to_its_mean_wait(scenarios, scenario: str) -> None:
    result = simulate(load_scenario(scenarios / f"{scenario}.yaml").with_duration(900))
    for run in result.runs:
        parts = run.report.wait_parts
        assert set(parts) == set(WaitSource)
        assert sum(parts.values()) == pytest.approx(run.report.wait["mean"], abs=0.01)
        for wait, split in run.waits_by_call.values():
            assert sum(split.values()) == pytest.approx(wait, abs=1e-6)
            assert min(split.values()) >= 0.0


def test_compare_calls_counts_only_calls_that_waited_longer_by_the_margin() -> None:
    none = dict.fromkeys(WaitSource, 0.0)
    ours = {1: (5.0, {**none, "slot": 5.0}), 2: (0.5, {**none, "load": 0.5}), 3: (9.0, none)}
    theirs = {1: (1.0, none), 2: (0.0, none)}
    comparison = compare_calls(ours, theirs, margin=1.0)
    assert (comparison.calls, comparison.worse, comparison.extra_seconds) == (2, 1, 4.0)
    assert comparison.by_source["slot"] == 5.0


def test_a_thread_on_the_slot_that_served_it_prefills_only_its_newest_step() -> None:
    # 0.001 s a token. The first call evaluates its whole 1000-token prompt (1 s); the
    # thread's second call shares the first 1000 tokens with what the one slot holds
    # and evaluates only its newest 500 (0.5 s). A call of another thread then starts
    # from nothing again (1500 tokens, 1.5 s), and its prefill is part of its wait.
    from kubemoot.emulation.prompt import Prompt

    async def main() -> list[WaitPhases]:
        gpu = EmulatedGpu("g", sizes_mib=SIZES, vram_mib=24576, max_parallel=1,
                          prefill_seconds_per_token=0.001)
        out = []
        for prompt in (Prompt.thread("a", [], system=1000),
                       Prompt.thread("a", [500], system=1000),
                       Prompt.thread("b", [500], system=1000)):
            phases = WaitPhases(asyncio.get_running_loop().time())
            CURRENT_CALL.set(phases)
            await gpu.serve("small", 1.0, prompt=prompt)
            out.append(phases)
        await gpu.close()
        return out

    first, second, other = run_virtual(main())
    assert [p.split()[WaitSource.PREFILL] for p in (first, second, other)] == pytest.approx(
        [1.0, 0.5, 1.5])
    assert first.split()[WaitSource.LOAD] == pytest.approx(4.0)  # 4 GiB at 1 GiB/s
    assert second.split() == {"slot": 0.0, "load": 0.0, "eviction": 0.0, "memory": 0.0,
                              "prefill": pytest.approx(0.5)}


def _split_with_builtins(p: WaitPhases) -> dict[WaitSource, float]:
    """The split as it was written with max() and min(): the spelt-out form must agree."""
    parts = dict.fromkeys(WaitSource, 0.0)
    if p.started is None or p.engine_request is None:
        return parts
    before = max(0.0, p.engine_request - p.issued)
    evicting = min(before, p.policy_evicting)
    parts[WaitSource.EVICTION] += evicting
    parts[WaitSource.SLOT if p.joined_warm else WaitSource.MEMORY] += before - evicting
    assigned = p.engine_assigned if p.engine_assigned is not None else p.engine_request
    queued = max(0.0, assigned - p.engine_request)
    in_queue_evict = min(queued, p.queue_evicting)
    in_queue_load = min(queued - in_queue_evict, p.queue_loading)
    parts[WaitSource.EVICTION] += in_queue_evict
    parts[WaitSource.LOAD] += in_queue_load
    parts[WaitSource.MEMORY] += queued - in_queue_evict - in_queue_load
    ready = p.runner_ready if p.runner_ready is not None else assigned
    parts[WaitSource.LOAD] += max(0.0, ready - assigned)
    parts[WaitSource.SLOT] += max(0.0, p.started - ready)
    if p.first_token is not None:
        parts[WaitSource.PREFILL] += max(0.0, p.first_token - p.started)
    return parts


_times = st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.0, 2.5]),
                   st.floats(min_value=-5.0, max_value=50.0))
_spans = st.one_of(st.sampled_from([0.0, -0.0, 3.0]), st.floats(min_value=-1.0, max_value=20.0))


@given(issued=st.floats(min_value=0.0, max_value=10.0), request=_times, assigned=_times,
       ready=_times, started=_times, first=_times, evicting=_spans, q_evict=_spans,
       q_load=_spans, warm=st.booleans())
@settings(max_examples=400, deadline=None)
def test_the_split_is_what_max_and_min_give(issued: float, request: float | None,
                                            assigned: float | None, ready: float | None,
                                            started: float | None, first: float | None,
                                            evicting: float, q_evict: float, q_load: float,
                                            warm: bool) -> None:
    phases = WaitPhases(issued, engine_request=request, engine_assigned=assigned,
                        runner_ready=ready, started=started, first_token=first,
                        policy_evicting=evicting, queue_evicting=q_evict,
                        queue_loading=q_load, joined_warm=warm)
    got, want = phases.split(), _split_with_builtins(phases)
    assert list(got) == list(want)
    assert [repr(v) for v in got.values()] == [repr(v) for v in want.values()]  # -0.0 too
