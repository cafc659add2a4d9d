"""Running a scenario: one trace, every policy, in virtual time.

:func:`simulate` builds the trace once from (scenario, seed) and runs each policy on
its own fresh fleet and its own :class:`~kubemoot.sim.vloop.VirtualTimeLoop`, so the
policies see the identical workload and nothing leaks between runs. A run ends when
every discussion has ended (the trace's arrivals stop at ``durationSeconds``; calls in
flight then are served to completion).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubemoot.api.errors import InputError
from kubemoot.frozen import quick_init
from kubemoot.sim.bound import LowerBound, lower_bound
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.metrics import FAILED, FINISHED, PolicyReport, Recorder, SimulatedOutcome
from kubemoot.sim.phases import CURRENT_CALL, WaitPhases, WaitSource
from kubemoot.sim.policies import BASELINES, Policy, SimContext
from kubemoot.sim.scenario import Scenario
from kubemoot.sim.vloop import run_virtual, sleep
from kubemoot.sim.workload import CallSpec, Discussion, Trace, Turn, build_trace

__all__ = ["POLICY_NAMES", "PolicyRun", "ServedCall", "SimulationResult", "make_policy",
           "run_policy", "simulate"]

T = TypeVar("T")

POLICY_NAMES: tuple[str, ...] = ("kubemoot", *BASELINES)
PLOTTED_PROVIDERS = 16  # VRAM-over-time is drawn for at most this many cards
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: virtual time 0 as a Unix time
#: The collector's first threshold during a run (Python's default is 700 allocations).
RUN_COLLECTION_THRESHOLD = 10_000


def make_policy(name: str) -> Policy:
    """A fresh policy object by name (``kubemoot`` is the production runtime)."""
    if name == "kubemoot":
        from kubemoot.sim.runtime_policy import KubemootPolicy

        return KubemootPolicy()
    if name in BASELINES:
        return BASELINES[name]()
    raise InputError(
        f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)} or all", field="policy"
    )


@dataclass(slots=True)
class PolicyRun:
    """One policy's report plus the series the plots need."""

    report: PolicyReport
    loads: list[tuple[float, str, str, int]]
    unloads: list[tuple[float, str, str, str]]
    vram_samples: list[tuple[float, dict[str, int]]]
    capacity_mib: dict[str, int]
    end: float
    statuses: dict[int, str] = field(default_factory=dict)  # call id → how it ended
    peak_mib: dict[str, int] = field(default_factory=dict)  # card → most VRAM ever in use
    usable_mib: dict[str, int] = field(default_factory=dict)
    # call id → (wait, its split by phase) for finished calls: compares policies call by call
    waits_by_call: dict[int, tuple[float, dict[WaitSource, float]]] = field(default_factory=dict)
    # call id → where and when a finished call ran: the optimum's hint and the timelines
    served: dict[int, ServedCall] = field(default_factory=dict)


@quick_init
@dataclass(frozen=True, slots=True)
class ServedCall:
    """Where a finished call ran, and when it was issued, started and ended."""

    card: str
    model: str
    issued: float
    started: float
    ended: float


@dataclass(slots=True)
class SimulationResult:
    scenario: str
    seed: int
    trace_calls: int
    discussions: int
    bound: LowerBound
    runs: list[PolicyRun] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "traceCalls": self.trace_calls,
            "discussions": self.discussions,
            "lowerBound": {
                "meanWaitSeconds": round(self.bound.mean_wait, 3),
                "calls": self.bound.calls,
                "firstReadySeconds": {m: round(t, 3) for m, t in self.bound.first_ready.items()},
            },
            "policies": [run.report.to_json() for run in self.runs],
        }


def build_fleet(
    scenario: Scenario, recorder: Recorder, *, epoch: float = EPOCH
) -> dict[str, EmulatedGpu]:
    spec = scenario.spec
    sizes = {m.name: m.vram_mib for m in spec.models}
    gpus: dict[str, EmulatedGpu] = {}
    for group in spec.providers:
        width = len(str(group.count - 1))
        for i in range(group.count):
            name = group.name if group.count == 1 else f"{group.name}-{i:0{width}d}"
            gpus[name] = EmulatedGpu(
                name,
                vram_mib=group.vram_mib,
                sizes_mib=sizes,
                reserve_mib=group.reserve_mib,
                max_parallel=group.max_parallel,
                load_rate_mibps=group.load_rate_mibps or spec.settings.load_rate_mibps,
                unload_seconds=(
                    spec.settings.unload_seconds
                    if group.unload_seconds is None else group.unload_seconds
                ),
                keep_alive_seconds=spec.settings.keep_alive_seconds,
                context_length=group.context_length,
                events=recorder,
                epoch=epoch,
            )
    if len(gpus) != sum(g.count for g in spec.providers):
        raise InputError("expanded provider names collide", field="spec.providers")
    return dict(sorted(gpus.items()))


async def _run_turn(
    turn: Turn, discussion: Discussion, policy: Policy, ctx: SimContext, recorder: Recorder
) -> None:
    loop = asyncio.get_running_loop()

    async def one(call: CallSpec) -> SimulatedOutcome:
        issued = loop.time()
        phases = WaitPhases(issued)
        CURRENT_CALL.set(phases)  # this task's own context: the engine fills it in
        try:
            outcome = await policy.run_call(call, ctx)
        except Exception as error:  # a policy bug must show up as a failure, not vanish
            if isinstance(error, AssertionError):
                raise
            outcome = SimulatedOutcome(FAILED, model=call.model, reason=f"{type(error).__name__}: "
                                  f"{error}")
        ended = loop.time()
        if outcome.status == FINISHED and outcome.started is not None:
            ended = outcome.started + call.duration
        recorder.call_ended(call_id=call.call_id, discussion_id=discussion.discussion_id,
                            issued=issued, ended=max(ended, loop.time()), outcome=outcome,
                            phases=phases)
        return outcome

    for step in turn.steps:
        if step.think_seconds:
            await sleep(step.think_seconds, loop)
        outcomes = await _all(loop, [one(c) for c in step.calls])
        if any(o.status != FINISHED for o in outcomes):
            return  # the agent stood aside or failed: its turn ends here


async def _all(loop: asyncio.AbstractEventLoop, calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """``asyncio.gather(*calls)``, taking the same loop turns, without its machinery.

    Each call runs in its own task, started in order; each task's end reaches a done
    callback on the next turn, and the last one wakes the caller on the turn after, as
    gather's do (the simulator's decisions depend on the order of turns). The first
    call to fail fails the whole, as in gather; cancelling the caller cancels the calls.
    """
    tasks = [loop.create_task(call) for call in calls]
    done: asyncio.Future[None] = loop.create_future()
    left = len(tasks)

    def ended(task: asyncio.Task[T]) -> None:
        nonlocal left
        left -= 1
        if done.done():
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" warning
            return
        if task.cancelled():
            done.set_exception(asyncio.CancelledError())
        elif (error := task.exception()) is not None:
            done.set_exception(error)
        elif left == 0:
            done.set_result(None)

    for task in tasks:
        task.add_done_callback(ended)
    try:
        await done
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        raise
    return [task.result() for task in tasks]


async def _sample_vram(gpus: list[EmulatedGpu], every: float, recorder: Recorder) -> None:
    loop = asyncio.get_running_loop()
    while True:
        recorder.vram_samples.append((loop.time(), {g.name: g.engine.used_mib for g in gpus}))
        await sleep(every, loop)


async def _run(scenario: Scenario, trace: Trace, policy_name: str, seed: int) -> PolicyRun:
    # Made before the clocks start: the first kubemoot policy imports the whole runtime,
    # a cost of the process once, not of its calls (the figures are per call).
    policy = make_policy(policy_name)
    wall = time.perf_counter()
    cpu = time.process_time()  # steadier than wall time on a shared machine
    loop = asyncio.get_running_loop()
    recorder = Recorder()
    gpus = build_fleet(scenario, recorder)
    sizes = {m.name: m.vram_mib for m in scenario.spec.models}
    ctx = SimContext(gpus=gpus, sizes=sizes, trace=trace,
                     rng=random.Random(f"{seed}:{policy_name}"), epoch=EPOCH,
                     extras={"gpu_wait_limit_seconds":
                             scenario.spec.settings.gpu_wait_limit_seconds})
    await policy.start(ctx)
    plotted = list(gpus.values())[:PLOTTED_PROVIDERS]
    sampler = loop.create_task(
        _sample_vram(plotted, scenario.spec.settings.sample_seconds, recorder)
    )
    tasks: list[asyncio.Task[None]] = []
    for discussion in trace.discussions:
        delay = discussion.arrival - loop.time()
        if delay > 0:
            await sleep(delay, loop)
        for turn in discussion.turns:
            tasks.append(loop.create_task(_run_turn(turn, discussion, policy, ctx, recorder)))
    await asyncio.gather(*tasks)
    end = loop.time()
    sampler.cancel()
    await policy.stop()
    busy = 0.0
    for gpu in gpus.values():
        gpu.engine.finish_busy(end)
        busy += gpu.engine.busy_seconds
        await gpu.close()
    arrivals = {d.discussion_id: d.arrival for d in trace.discussions}
    by_call = recorder.waits_by_call()
    report = recorder.report(
        policy=policy_name, discussions=arrivals, busy_seconds=busy, gpu_count=len(gpus),
        end=end, vram_checks=sum(g.engine.vram_checks for g in gpus.values()),
        wall_seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu,
        by_call=by_call,
    )
    statuses: dict[int, str] = {}
    served: dict[int, ServedCall] = {}
    for record in recorder.calls:
        if record.call_id in statuses:
            raise AssertionError(f"call {record.call_id} ended twice")
        statuses[record.call_id] = record.outcome.status
        o = record.outcome
        if o.status == FINISHED and o.provider and o.model and o.started is not None:
            served[record.call_id] = ServedCall(o.provider, o.model, record.issued, o.started,
                                            record.ended)
    return PolicyRun(
        report, recorder.loads, recorder.unloads, recorder.vram_samples,
        {g.name: g.usable_mib for g in plotted}, end, statuses,
        {g.name: g.engine.peak_mib for g in gpus.values()},
        {g.name: g.usable_mib for g in gpus.values()},
        waits_by_call=by_call, served=served,
    )


@contextlib.contextmanager
def _collecting_less() -> Iterator[None]:
    """The cycle collector, tuned for one run and put back after it.

    A run allocates millions of short-lived objects that reference counting frees; the
    collector's passes over them found little, and each older-generation pass walked
    everything the process held before the run too (the trace, earlier policies'
    results). Frozen, those are left out; a higher threshold makes fewer passes.
    Decisions do not depend on when cycles are collected.
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(RUN_COLLECTION_THRESHOLD, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def run_policy(scenario: Scenario, trace: Trace, policy_name: str, *, seed: int) -> PolicyRun:
    """Run one policy on a trace in its own virtual-time loop."""
    with _collecting_less():
        return run_virtual(_run(scenario, trace, policy_name, seed))


def simulate(
    scenario: Scenario,
    *,
    policies: Sequence[str] = POLICY_NAMES,
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> SimulationResult:
    """Build the trace, run every requested policy on it, and compare with the bound."""
    for name in policies:
        if name not in POLICY_NAMES:
            make_policy(name)  # raises the InputError naming the choices
    used_seed = scenario.spec.seed if seed is None else seed
    trace = build_trace(scenario, seed=used_seed)
    bound = lower_bound(scenario, trace)
    result = SimulationResult(scenario.name, used_seed, trace.call_count,
                              len(trace.discussions), bound)
    for name in policies:
        run = run_policy(scenario, trace, name, seed=used_seed)
        if bound.mean_wait > 0:
            run.report.ratio_to_lower_bound = round(run.report.wait["mean"] / bound.mean_wait, 3)
        result.runs.append(run)
        if progress is not None:
            progress(name)
    return result
