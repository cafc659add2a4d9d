"""Per-call placement latency: place + claim + release.

* Embedded: 64 providers and 12 models on MemoryKV, p50/p99 of one call's
  place → claim → release (goal: p99 ≤ 1 ms).
* Embedded at scale: the same with 1,000 providers (goal: p99 ≤ 2 ms).
* NATS, uncontended: the same loop against a real ``nats-server -js`` (8 providers),
  with the raw ``get`` + ``update`` round trip measured in the same run as the floor
  (goal: p99 ratio ≤ 1.5). Floor and calls are sampled in turns (one round trip, one
  call, …), so load from elsewhere on the machine weighs on both alike. A call writes
  the ticket document twice (the claim, the release) and reads nothing, so a second
  floor, two raw ``update`` round trips, is sampled in the same turns: the call's p99
  over it (``natsP99RatioToTwoWrites``). A call waits for the claim's acknowledgement
  and not for the release's (the release returns once its write is sent,
  ``TicketManager.release_sent``, as it does for every caller of the runtime): after
  each call the loop waits outside the timed window until the lanes have heard it,
  so the next sample is not charged with it, and prints how long after the call's
  return that was (``natsReleaseHeardAfterReturnP99Ms``) and the NATS messages a call
  received before it returned (``natsMessagesReceivedBeforeReturnPerCall``: the
  claim's acknowledgement, and deliveries of the call's writes to this process's
  watch that came before it).

Wall-clock tails on a shared machine follow the load, so each run also counts the
Python function calls (cProfile's total, which counts each resumption of a coroutine as a
call) of one place + claim + release, after the timed calls: on the embedded store
(``embeddedPythonCallsPerCall``, 64 providers), on NATS (``natsPythonCallsPerCall``), and
of the NATS floor's ``get`` + ``update`` (``natsPythonCallsPerFloor``). The counts are
averages over a few hundred calls and move by well under one per cent between runs. The
same profiles count the event loop's turns per call and per floor
(``natsLoopTurnsPerCall``, ``natsLoopTurnsPerFloor``: asyncio's ``_run_once``, one wait
in ``select`` and one pass over the callbacks then ready each).

Human-readable lines first; the last line is one JSON object:
``{"embeddedP99Ms": …, "embeddedP99MsAt1000Providers": …,
"embeddedCpuP99MsAt1000Providers": …, "natsP99Ratio": …, "natsP99RatioToTwoWrites": …,
"embeddedPythonCallsPerCall": …, "natsPythonCallsPerCall": …,
"natsPythonCallsPerFloor": …, "natsLoopTurnsPerCall": …, "natsLoopTurnsPerFloor": …,
"natsMessagesReceivedBeforeReturnPerCall": …, "natsReleaseHeardAfterReturnP99Ms": …}``
(the CPU figure is this thread's CPU time per call: on a shared machine it leaves other
processes out).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kubemoot.clock import SystemClock
from kubemoot.runtime.builder import build_runtime
from kubemoot.runtime.placement import CandidateModel
from kubemoot.runtime.planner import CallPlanner
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import ProviderState, ResidentModel
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import KV, Bucket

MODELS = [f"model-{i:02d}:{size}b" for i, size in enumerate([3, 7, 8, 14, 14, 24, 32, 7, 3, 8,
                                                             14, 32])]
SIZES_MIB = {m: int(m.rsplit(":", 1)[1].rstrip("b")) * 700 for m in MODELS}


def fleet(count: int, rng: random.Random) -> list[ProviderState]:
    states = []
    for i in range(count):
        total = rng.choice([16, 24, 32, 48, 80]) * 1024
        residents: list[ResidentModel] = []
        used = 0
        for model in rng.sample(MODELS, 3):
            if used + SIZES_MIB[model] <= total - 2048:
                residents.append(ResidentModel(name=model, size_mib=SIZES_MIB[model]))
                used += SIZES_MIB[model]
        states.append(ProviderState(
            provider=f"gpu-{i:04d}", endpoint=f"http://gpu-{i:04d}:11434", ready=True,
            total_vram_mib=total, max_parallel=4, context_length=8192, loaded_models=residents,
        ))
    return states


async def build(kv: KV, providers: int, rng: random.Random,
                settings: RuntimeSettings | None = None) -> CallPlanner:
    runtime = await build_runtime(kv, clock=SystemClock(), declared=SIZES_MIB,
                                  settings=settings)
    for state in fleet(providers, rng):
        await runtime.states.put(encode_token(state.provider), state.to_json())
    # As the agent runtime does: watches keep the view current. Nothing waits here.
    await runtime.start(watch=False)
    return runtime.planner


async def loop(
    planner: CallPlanner, calls: int, rng: random.Random, *, floor: Bucket | None = None,
    cpu: list[float] | None = None, writes: list[float] | None = None,
    settles: list[float] | None = None,
) -> tuple[list[float], int, list[float]]:
    """Place, claim and release ``calls`` times: samples in ms, placed, floor samples.

    With ``floor``, one raw ``get`` + ``update`` round trip on it precedes every call,
    and, with ``writes`` too, two raw ``update`` round trips (appended to ``writes``).
    With ``cpu``, each call's CPU time in this thread (ms) is appended to it: on a
    shared machine the wall-clock tail is mostly other processes' time slices, which
    the thread's CPU time leaves out. Its clock is read outside the wall-clock window.

    With ``settles`` (NATS), after each call the loop waits, outside the timed window,
    until the ticket lanes have heard every acknowledgement (a release returns once
    its write is sent: ``TicketManager.release_sent``), so that neither the next call
    nor the next floor sample is charged with hearing it; how long after the call
    returned that was (ms) is appended to ``settles``.
    """
    samples: list[float] = []
    floor_samples: list[float] = []
    placed = 0
    for i in range(calls):
        if floor is not None:
            floor_samples.append(await round_trip(floor))
            if writes is not None:
                writes.append(await two_writes(floor))
        model = rng.choice(MODELS)
        candidates = [CandidateModel(model, 70), CandidateModel(rng.choice(MODELS), 65)]
        start_cpu = time.thread_time() if cpu is not None else 0.0
        start = time.perf_counter()
        placement = await planner.place(candidates, holder_id=f"bench-{i}", prompt_tokens=2000)
        await planner.release(placement)
        returned = time.perf_counter()
        samples.append((returned - start) * 1000)
        if settles is not None:
            await settled(planner)
            settles.append((time.perf_counter() - returned) * 1000)
        if cpu is not None:
            cpu.append((time.thread_time() - start_cpu) * 1000)
        placed += placement.ticket is not None
    return samples, placed, floor_samples


async def settled(planner: CallPlanner) -> None:
    """Wait until the ticket lanes heard every acknowledgement. A tree from before
    ``TicketManager.quiet`` (run with this bench for a comparison) awaited its
    release's acknowledgement in the call: nothing is left to wait for there."""
    quiet = getattr(planner.tickets, "quiet", None)
    if quiet is not None:
        await quiet()


PROFILED_CALLS = 300


async def python_calls(
    planner: CallPlanner, rng: random.Random, floor: Bucket | None = None,
) -> tuple[tuple[float, float], tuple[float, float] | None]:
    """Python calls and event-loop turns per place + claim + release, and with
    ``floor`` per raw ``get`` + ``update`` on it (cProfile's totals over
    :data:`PROFILED_CALLS` of each). On NATS (``floor``) each call is let settle as
    in the timed loop, so the release's acknowledgement is counted with its call."""

    async def floor_calls() -> None:
        assert floor is not None
        for _ in range(PROFILED_CALLS):
            await round_trip(floor)

    per_call = await _counted(loop(planner, PROFILED_CALLS, rng,
                                   settles=None if floor is None else []))
    per_floor = None if floor is None else await _counted(floor_calls())
    return per_call, per_floor


def messages(kv: Any) -> tuple[int, int]:
    """The NATS messages this connection sent and received so far (nats-py's counts:
    publishes, and deliveries to its subscriptions, acknowledgements included)."""
    stats = kv.connection.stats
    return stats["out_msgs"], stats["in_msgs"]


async def _counted(work: Any) -> tuple[float, float]:
    """cProfile's calls, and the loop's turns (its ``_run_once`` calls: each is a wait
    in ``select`` and a pass over the callbacks then ready), per operation."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        await work
    finally:
        profiler.disable()
    stats: Any = pstats.Stats(profiler)
    turns = sum(row[1] for (path, _line, name), row in stats.stats.items()
                if name == "_run_once" and path.endswith("base_events.py"))
    return float(stats.total_calls) / PROFILED_CALLS, turns / PROFILED_CALLS


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def floor_bucket(kv: KV) -> Bucket:
    bucket = await kv.bucket("kubemoot_bench_floor")
    await bucket.put("k", b"{}")
    return bucket


async def round_trip(bucket: Bucket) -> float:
    """One raw ``get`` + ``update`` (the floor any compare-and-set pays), in ms."""
    start = time.perf_counter()
    entry = await bucket.get("k")
    assert entry is not None
    await bucket.update("k", b"{}", expected_revision=entry.revision)
    return (time.perf_counter() - start) * 1000


async def two_writes(bucket: Bucket) -> float:
    """Two raw ``update`` round trips (what a claim and its release must write), in ms."""
    entry = await bucket.get("k")
    assert entry is not None
    start = time.perf_counter()
    revision = await bucket.update("k", b"{}", expected_revision=entry.revision)
    await bucket.update("k", b"{}", expected_revision=revision)
    return (time.perf_counter() - start) * 1000


async def embedded(calls: int, providers: int = 64,
                   count: bool = True) -> tuple[float, float, float | None]:
    rng = random.Random(7)
    kv = MemoryKV()
    planner = await build(kv, providers, rng)
    await loop(planner, min(calls, 1000), rng)  # warm-up: first-use costs stay out
    cpu: list[float] = []
    samples, placed, _ = await loop(planner, calls, rng, cpu=cpu)
    counted = (await python_calls(planner, rng))[0][0] if count else None
    await kv.close()
    p50, p99 = pct(samples, 0.5), pct(samples, 0.99)
    print(f"embedded, {providers} providers, 12 models: {calls} calls ({placed} placed) "
          f"p50 {p50:.3f} ms  p99 {p99:.3f} ms  mean {statistics.fmean(samples):.3f} ms; "
          f"CPU p50 {pct(cpu, 0.5):.3f} ms  p99 {pct(cpu, 0.99):.3f} ms"
          + ("" if counted is None else f"; {counted:.0f} Python calls per call"))
    return p99, pct(cpu, 0.99), counted


async def nats(calls: int) -> tuple[float, float, tuple[float, float], tuple[float, float],
                                   tuple[float, float, float, float, float], float] | None:
    try:
        from kubemoot.settings import NatsSettings
        from kubemoot.store.nats import NatsKV
        from kubemoot.testing.nats_server import running_nats_server
    except ImportError as error:
        print(f"nats: skipped ({error})")
        return None
    rng = random.Random(11)
    async with running_nats_server() as server:
        kv = await NatsKV.connect(NatsSettings(servers=[server.url]))
        try:
            planner = await build(kv, 8, rng)
            floor = await floor_bucket(kv)
            await loop(planner, 50, rng, floor=floor, writes=[])  # warm-up
            writes: list[float] = []
            settles: list[float] = []
            samples, placed, floor_samples = await loop(planner, calls, rng, floor=floor,
                                                        writes=writes, settles=settles)
            counted, floor_counted = await python_calls(planner, rng, floor)
            assert floor_counted is not None
            waited = await message_counts(kv, planner, rng, floor)
        finally:
            await kv.close()
    p50, p99 = pct(samples, 0.5), pct(samples, 0.99)
    f50, f99 = pct(floor_samples, 0.5), pct(floor_samples, 0.99)
    w50, w99 = pct(writes, 0.5), pct(writes, 0.99)
    ratio = p99 / f99
    print(f"nats floor (get + update): p50 {f50:.3f} ms  p99 {f99:.3f} ms")
    print(f"nats two writes (update + update): p50 {w50:.3f} ms  p99 {w99:.3f} ms")
    print(f"nats, 8 providers, uncontended: {calls} calls ({placed} placed) "
          f"p50 {p50:.3f} ms  p99 {p99:.3f} ms  → p99 ratio {ratio:.2f}, "
          f"to two writes {p99 / w99:.2f}")
    print(f"nats, release acknowledged after the call returned: p50 "
          f"{pct(settles, 0.5):.3f} ms  p99 {pct(settles, 0.99):.3f} ms")
    print(f"nats, Python calls: {counted[0]:.0f} per call, {floor_counted[0]:.0f} per "
          f"floor get + update ({counted[0] / floor_counted[0]:.2f}x); loop turns: "
          f"{counted[1]:.1f} per call, {floor_counted[1]:.1f} per floor")
    print(f"nats, messages per call: {waited[0]:.2f} sent, {waited[1]:.2f} received before "
          f"it returned, {waited[2]:.2f} after; per floor: {waited[3]:.2f} sent, "
          f"{waited[4]:.2f} received")
    return ratio, p99 / w99, counted, floor_counted, waited, pct(settles, 0.99)


async def message_counts(kv: Any, planner: CallPlanner, rng: random.Random,
                         floor: Bucket) -> tuple[float, float, float, float, float]:
    """NATS messages per call (sent; received before it returned; received after,
    until its lanes settled) and per floor ``get`` + ``update`` (sent, received),
    averaged over :data:`PROFILED_CALLS` of each. A received message is an
    acknowledgement, a reply, or a delivery of a write to a watch of this process."""
    sent = before = after = 0
    for i in range(PROFILED_CALLS):
        model = rng.choice(MODELS)
        candidates = [CandidateModel(model, 70), CandidateModel(rng.choice(MODELS), 65)]
        out0, in0 = messages(kv)
        placement = await planner.place(candidates, holder_id=f"count-{i}",
                                        prompt_tokens=2000)
        await planner.release(placement)
        out1, in1 = messages(kv)
        await settled(planner)
        await asyncio.sleep(0.002)  # the last delivery of the call's writes, too
        out2, in2 = messages(kv)
        sent += out2 - out0
        before += in1 - in0
        after += in2 - in1
    out0, in0 = messages(kv)
    for _ in range(PROFILED_CALLS):
        await round_trip(floor)
    await asyncio.sleep(0.002)
    out1, in1 = messages(kv)
    n = PROFILED_CALLS
    return sent / n, before / n, after / n, (out1 - out0) / n, (in1 - in0) / n


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--nats-calls", type=int, default=1000)
    parser.add_argument("--large-providers", type=int, default=1000,
                        help="providers in the at-scale run (the key keeps its name)")
    args = parser.parse_args()
    embedded_p99, _cpu, embedded_counted = await embedded(args.calls)
    # Ten times the fleet the first goal named, and more: a big cluster's state view.
    embedded_p99_large, cpu_p99_large, _ = await embedded(
        args.calls, providers=args.large_providers, count=False)
    ratios = await nats(args.nats_calls)
    print(json.dumps({
        "embeddedP99Ms": round(embedded_p99, 4),
        "embeddedP99MsAt1000Providers": round(embedded_p99_large, 4),
        "embeddedCpuP99MsAt1000Providers": round(cpu_p99_large, 4),
        "natsP99Ratio": None if ratios is None else round(ratios[0], 3),
        "natsP99RatioToTwoWrites": None if ratios is None else round(ratios[1], 3),
        "embeddedPythonCallsPerCall": None if embedded_counted is None
        else round(embedded_counted, 1),
        "natsPythonCallsPerCall": None if ratios is None else round(ratios[2][0], 1),
        "natsPythonCallsPerFloor": None if ratios is None else round(ratios[3][0], 1),
        "natsLoopTurnsPerCall": None if ratios is None else round(ratios[2][1], 2),
        "natsLoopTurnsPerFloor": None if ratios is None else round(ratios[3][1], 2),
        "natsMessagesReceivedBeforeReturnPerCall": None if ratios is None
        else round(ratios[4][1], 2),
        "natsReleaseHeardAfterReturnP99Ms": None if ratios is None
        else round(ratios[5], 4),
    }))


if __name__ == "__main__":
    asyncio.run(main())
