"""Shared-state benchmark: KV round trips, ticket claims, and claims under contention.

Run: ``.venv/bin/python bench/kv.py [--seconds 3] [--claimers 20] [--processes 20]``

It starts its own ``nats-server -js`` and measures, in one run:

1. the floor: a raw ``get`` + ``update`` round trip on NATS, and on the embedded store;
2. claim + release, uncontended, on NATS: p50/p99 and the p99's ratio to the floor's.
   The floor and the claims are sampled in turns (floor, claim, floor, claim, …) so
   that whatever else the machine is doing meanwhile weighs on both alike. Claims are
   measured the way the runtime makes them, with the provider state the caller holds
   (``uncontendedP99Ratio``), and also reading the state on every claim
   (``uncontendedReadStateP99Ratio``);
3. contention: ``--claimers`` claimers spread over ``--processes`` worker processes,
   every process with its own NATS connection, all claiming on one provider for
   ``--seconds``: successful claims per second, p99 claim latency, overcommits, and
   ``fairness``: the claims granted to the slowest process over the fastest's (racing
   processes should get about equal shares; 0 means some process starved).

Overcommits are counted on the memory actually held: each worker adds a ticket's
footprint to a counter shared by all processes right after the claim is granted and
subtracts it right before the release, so a sum above the usable VRAM is memory spent
twice. The provider's usable VRAM is smaller than all claimers' footprints together,
so the budget really binds (some claims are rejected; those are reported too).

A second contended run spreads the same claimers over ``--many-processes`` processes
(default 20, one claimer each: every agent pod is a process) and reports
``fairnessProcesses``, ``claimsPerSecondProcesses`` and ``p99MsProcesses``.

Every worker's ticket manager has the claim line's entrance (claims and releases that
lost a race announced in ``kubemoot_ticket_requests`` for any writer to apply;
``docs/shared-state.md``); ``--announce off`` runs the same workers without it.

``--count-requests`` counts, in every worker, the requests its ticket manager sends the
server (gets, creates and deletes per bucket; compare-and-sets won and lost) and prints
them per granted claim for each contended run (key ``requestsPerClaimProcesses``).

With ``--count-requests`` the same figure also counts the changes each worker's watches
delivered (``… delivered``): every one wakes the process that follows the bucket; with
the bus, the requests sent to a combiner and the messages it delivered (``bus …``).
``wakeUpsPerClaimProcesses`` sums what woke a worker per granted claim.

Every worker also gets a bus on its NATS connection, so that under contention one of
them combines the others' operations (``kubemoot.runtime.ticket_delegation``);
``--combine off`` runs them without one (the claim line's announcements only).

``--profile DIR`` profiles every worker while it claims (cProfile, CPU time) and prints the
functions with the most self time over the many-process run's workers.

``workerCpuMsPerClaim`` (and ``…Processes`` for the second run) is the CPU time all
workers spent while claiming (``time.process_time``), per granted claim: unlike the
claims per second it does not move with the machine's load.

The last line is one JSON object with the figures the issue asks for.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import glob
import json
import multiprocessing as mp
import pstats
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubemoot.clock import SystemClock
from kubemoot.runtime.tickets import ClaimConflict, ClaimRejected, TicketManager
from kubemoot.settings import NatsSettings
from kubemoot.store.bus import Bus, Handler, Message, Subscription
from kubemoot.store.documents import (
    PROVIDER_STATE_BUCKET,
    PROVIDER_TICKETS_BUCKET,
    TICKET_REQUESTS_BUCKET,
    ProviderState,
)
from kubemoot.store.memory import MemoryKV
from kubemoot.store.nats import NatsKV
from kubemoot.store.natsbus import NatsBus
from kubemoot.store.protocol import (
    KV,
    Bucket,
    Change,
    Entry,
    RevisionMismatch,
    StoreError,
    Watch,
)
from kubemoot.testing.nats_server import running_nats_server

PROVIDER = "gpu-a"
RESERVE_MIB = 1024
USABLE_MIB = 40 * 1024  # 20 claimers × 1–4 GiB (2.5 GiB mean) ≈ 50 GiB wanted


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def timed(n: int, step: Callable[[], Awaitable[None]]) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - start)
    return samples


async def floor_step(kv: KV) -> Callable[[], Awaitable[None]]:
    """One raw ``get`` + ``update`` round trip: what any compare-and-set must cost."""
    bucket = await kv.bucket("bench_floor", max_age=600)
    await bucket.put("k", b"0")

    async def step() -> None:
        entry = await bucket.get("k")
        assert entry is not None
        await bucket.update("k", entry.value, expected_revision=entry.revision)

    return step


async def floor(kv: KV, n: int) -> list[float]:
    step = await floor_step(kv)
    await timed(50, step)  # warm up
    return await timed(n, step)


async def in_turns(
    n: int, steps: list[Callable[[], Awaitable[None]]]
) -> list[list[float]]:
    """Sample each step ``n`` times, taking the steps in turn (after a warm-up)."""
    for step in steps:
        await timed(50, step)
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(n):
        for step, into in zip(steps, samples, strict=True):
            start = time.perf_counter()
            await step()
            into.append(time.perf_counter() - start)
    return samples


class CountingBucket:
    """A bucket that counts the requests sent through it (``--count-requests``)."""

    def __init__(self, inner: Bucket, what: str, counts: collections.Counter[str]) -> None:
        self.inner = inner
        self.name = inner.name
        self._what = what
        self._counts = counts

    async def get(self, key: str) -> Entry | None:
        self._counts[f"{self._what} get"] += 1
        return await self.inner.get(key)

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        self._counts[f"{self._what} create"] += 1
        return await self.inner.create(key, value, ttl=ttl)

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        try:
            revision = await self.inner.update(key, value, expected_revision=expected_revision)
        except RevisionMismatch:
            self._counts[f"{self._what} update lost"] += 1
            raise
        self._counts[f"{self._what} update won"] += 1
        return revision

    async def put(self, key: str, value: bytes) -> int:
        self._counts[f"{self._what} put"] += 1
        return await self.inner.put(key, value)

    async def delete(self, key: str, *, expected_revision: int | None = None) -> None:
        self._counts[f"{self._what} delete"] += 1
        await self.inner.delete(key, expected_revision=expected_revision)

    async def keys(self) -> list[str]:
        return await self.inner.keys()

    def watch(self) -> Watch:
        return CountingWatch(self.inner.watch(), f"{self._what} delivered", self._counts)


class CountingBus:
    """A bus that counts the requests sent and the messages its subscriptions deliver
    (each one a wake-up of this process)."""

    def __init__(self, inner: Bus, counts: collections.Counter[str]) -> None:
        self._inner = inner
        self._counts = counts

    async def publish(self, subject: str, data: bytes) -> None:
        self._counts["bus publish"] += 1
        await self._inner.publish(subject, data)

    async def subscribe(self, subject: str, handler: Handler, *,
                        queue: str = "") -> Subscription:
        async def counted(message: Message) -> None:
            self._counts["bus delivered"] += 1
            await handler(message)

        self._counts["bus subscribe"] += 1
        return await self._inner.subscribe(subject, counted, queue=queue)

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        self._counts["bus request"] += 1
        return await self._inner.request(subject, data, timeout=timeout)

    async def gather(self, subject: str, data: bytes, *, window: float) -> list[bytes]:
        return await self._inner.gather(subject, data, window=window)


class CountingWatch:
    """A watch that counts the changes it delivers to its reader (each one is a wake-up
    of the process that follows the bucket)."""

    def __init__(self, inner: Watch, what: str, counts: collections.Counter[str]) -> None:
        self._inner = inner
        self._what = what
        self._counts = counts

    def __aiter__(self) -> CountingWatch:
        return self

    async def __anext__(self) -> Change:
        change = await self._inner.__anext__()
        self._counts[self._what] += 1
        return change

    def drain(self) -> list[Change] | None:
        changes = self._inner.drain()
        if changes:
            self._counts[self._what] += len(changes)
        return changes

    async def ready(self) -> None:
        await self._inner.ready()

    async def aclose(self) -> None:
        await self._inner.aclose()


async def manager(kv: KV, *, announce: bool = True,
                  counts: collections.Counter[str] | None = None,
                  bus: Bus | None = None) -> TicketManager:
    """A ticket manager as a runtime builds one; ``announce``: with the claim line's
    entrance (claims that lost a race announced for other processes to apply);
    ``counts``: count the requests it sends."""
    tickets: Bucket = await kv.bucket(PROVIDER_TICKETS_BUCKET, max_age=600)
    states: Bucket = await kv.bucket(PROVIDER_STATE_BUCKET, max_age=600)
    requests: Bucket | None = (
        await kv.bucket(TICKET_REQUESTS_BUCKET, max_age=60) if announce else None
    )
    if counts is not None:
        tickets = CountingBucket(tickets, "tickets", counts)
        states = CountingBucket(states, "state", counts)
        if requests is not None:
            requests = CountingBucket(requests, "requests", counts)
    # No bus, no keyword: the same bench runs the code before the combiner existed.
    combining: dict[str, Any] = {} if bus is None else {"bus": bus}
    return TicketManager(tickets, states, clock=SystemClock(), requests=requests,
                         **combining)


def bench_state() -> ProviderState:
    return ProviderState(
        provider=PROVIDER,
        endpoint="http://gpu-a:11434",
        ready=True,
        total_vram_mib=USABLE_MIB + RESERVE_MIB,
        reserve_mib=RESERVE_MIB,
    )


async def publish_state(kv: KV) -> None:
    states = await kv.bucket(PROVIDER_STATE_BUCKET, max_age=600)
    await states.put(PROVIDER, bench_state().to_json())


async def uncontended(kv: KV, n: int) -> tuple[list[float], list[float], list[float]]:
    """Floor, claim + release with the caller's state, and reading the state: in turns."""
    tickets = await manager(kv)
    known = bench_state()  # what the runtime's provider view would hand the claim

    async def with_state() -> None:
        ticket = await tickets.claim(PROVIDER, "qwen3:8b", 1024, "bench",
                                     provider_state=known)
        await tickets.release(PROVIDER, ticket.ticket_id)

    async def reading_state() -> None:
        ticket = await tickets.claim(PROVIDER, "qwen3:8b", 1024, "bench")
        await tickets.release(PROVIDER, ticket.ticket_id)

    floor_samples, claims, reading = await in_turns(
        n, [await floor_step(kv), with_state, reading_state]
    )
    return floor_samples, claims, reading


# -- contended: worker processes --------------------------------------------------------


def worker(
    url: str, claimers: int, seconds: float, start: Any, seed: int,
    held: Any, overcommits: Any, results: Any, announce: bool, count: bool = False,
    profile: str | None = None, combine: bool = True,
) -> None:  # fmt: skip
    asyncio.run(_worker(url, claimers, seconds, start, seed, held, overcommits, results,
                        announce, count, profile, combine))


async def _worker(
    url: str, claimers: int, seconds: float, start: Any, seed: int,
    held: Any, overcommits: Any, results: Any, announce: bool, count: bool,
    profile: str | None, combine: bool,
) -> None:  # fmt: skip
    kv = await NatsKV.connect(NatsSettings(servers=[url], name=f"bench-{seed}"))
    requests: collections.Counter[str] = collections.Counter()
    bus: Bus | None = NatsBus(kv) if combine else None
    if bus is not None and count:
        bus = CountingBus(bus, requests)
    tickets = await manager(kv, announce=announce, counts=requests if count else None,
                            bus=bus)
    await tickets.open()  # follow the others' announcements from the start
    rng = random.Random(seed)
    latencies: list[float] = []
    counts: dict[str, float] = {"rejected": 0, "conflicts": 0, "unavailable": 0,
                                "releaseFailures": 0}
    known = bench_state()  # the state a runtime's provider view would hold
    # Every worker imported and connected before any claims: on a small machine twenty
    # interpreters starting up take seconds of CPU, and a fixed start time let the first
    # ones race while the rest were still importing (a start-up figure, not a claim one).
    await asyncio.get_running_loop().run_in_executor(None, start.wait, 300)
    requests.clear()  # from the start on: opening the watches is no claim's cost
    profiler = cProfile.Profile(time.process_time) if profile is not None else None
    if profiler is not None:
        profiler.enable()
    cpu_start = time.process_time()  # this worker's CPU, whatever the machine's load
    stop = time.perf_counter() + seconds

    async def claimer(index: int) -> None:
        while time.perf_counter() < stop:
            footprint = rng.randint(1, 4) * 1024
            started = time.perf_counter()
            try:
                ticket = await tickets.claim(PROVIDER, "m", footprint, f"w{seed}-{index}",
                                             provider_state=known)
            except ClaimRejected:
                counts["rejected"] += 1
                await asyncio.sleep(0.001)  # the memory is not there: try again shortly
                continue
            except ClaimConflict:
                counts["conflicts"] += 1
                continue
            except StoreError:  # e.g. an acknowledgement timed out on an overloaded machine
                counts["unavailable"] += 1
                continue
            latencies.append(time.perf_counter() - started)
            with held.get_lock():
                held.value += footprint
                if held.value > USABLE_MIB:
                    with overcommits.get_lock():
                        overcommits.value += 1
            await asyncio.sleep(0)  # "use" the memory
            with held.get_lock():
                held.value -= footprint
            try:
                await tickets.release(PROVIDER, ticket.ticket_id)
            except StoreError:  # lost every race: the TTL layer returns the memory
                counts["releaseFailures"] += 1

    try:
        await asyncio.gather(*(claimer(i) for i in range(claimers)))
    finally:
        counts["cpuSeconds"] = time.process_time() - cpu_start
        if profiler is not None and profile is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}-{seed}.pstats")
        results.put((latencies, counts, dict(requests)))
        await tickets.aclose()
        await kv.close()


def contended(
    url: str, claimers: int, processes: int, seconds: float, announce: bool = True,
    count: bool = False, profile: str | None = None, combine: bool = True,
) -> dict[str, Any]:
    context = mp.get_context("spawn")
    held = context.Value("q", 0)
    overcommits = context.Value("q", 0)
    results = context.Queue()
    per_process = [claimers // processes + (1 if i < claimers % processes else 0)
                   for i in range(processes)]
    counts = [n for n in per_process if n > 0]
    start = context.Barrier(len(counts))  # released once every worker is connected
    workers = [
        context.Process(
            target=worker,
            args=(url, n, seconds, start, seed, held, overcommits, results, announce,
                  count, None if profile is None else f"{profile}/p{processes}", combine),
        )
        for seed, n in enumerate(counts)
    ]
    for process in workers:
        process.start()
    latencies: list[float] = []
    per_worker: list[int] = []  # claims granted to each process
    rejected = conflicts = unavailable = release_failures = 0
    cpu_seconds = 0.0  # all workers' CPU time while claiming
    sent: collections.Counter[str] = collections.Counter()
    for _ in workers:
        sample, counts, requests = results.get(timeout=120)
        sent.update(requests)
        latencies.extend(sample)
        per_worker.append(len(sample))
        rejected += counts["rejected"]
        conflicts += counts["conflicts"]
        unavailable += counts["unavailable"]
        release_failures += counts["releaseFailures"]
        cpu_seconds += counts["cpuSeconds"]
    for process in workers:
        process.join(timeout=30)
    return {
        "claimsPerSecond": round(len(latencies) / seconds, 1),
        "p50Ms": ms(percentile(latencies, 0.5)),
        "p99Ms": ms(percentile(latencies, 0.99)),
        "rejected": rejected,
        "conflicts": conflicts,
        "unavailable": unavailable,
        "releaseFailures": release_failures,
        "overcommits": int(overcommits.value),
        "fairness": fairness(per_worker),
        "claimsPerProcess": sorted(per_worker),
        "workerCpuMsPerClaim": round(cpu_seconds * 1000 / max(1, len(latencies)), 2),
        **({"requestsPerClaim": {k: round(v / max(1, len(latencies)), 2)
                                 for k, v in sorted(sent.items())}} if count else {}),
    }


def print_profile(paths: list[str]) -> None:
    """The workers' profiles together: the functions with the most self time, and the
    call counts that say how often each ran."""
    if not paths:
        return
    stats = pstats.Stats(paths[0], stream=sys.stdout)
    for path in paths[1:]:
        stats.add(path)
    stats.sort_stats("tottime").print_stats(45)


def wake_ups(per_claim: dict[str, float]) -> float:
    """Messages that woke a worker per granted claim: every change its watches
    delivered, every message its bus subscriptions delivered, and every reply to a
    request it sent on the bus (the replies to its store requests are left out: each
    one answers a request the worker was waiting on anyway)."""
    return round(sum(v for k, v in per_claim.items() if k.endswith(" delivered"))
                 + per_claim.get("bus request", 0.0), 2)


def fairness(per_process: list[int]) -> float:
    """The slowest process's granted claims over the fastest's (1.0: equal shares)."""
    if not per_process or max(per_process) == 0:
        return 0.0
    return round(min(per_process) / max(per_process), 2)


async def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--claimers", type=int, default=20)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--many-processes", type=int, default=20,
                        help="a second contended run with the claimers in this many processes "
                             "(each agent pod is a process); 0 skips it")
    parser.add_argument("--announce", choices=("on", "off"), default="on",
                        help="off: claims that lose a race are not announced for other "
                             "processes to apply (every claim races on its own, as before "
                             "the claim line's entrance existed)")
    parser.add_argument("--count-requests", action="store_true",
                        help="count the requests every worker's ticket manager sends, per "
                             "granted claim")
    parser.add_argument("--profile", metavar="DIR",
                        help="profile every worker while it claims (cProfile) and write "
                             "DIR/p<processes>-<worker>.pstats; the slowest functions of "
                             "the many-process run are printed")
    parser.add_argument("--combine", choices=("on", "off"), default="on",
                        help="off: the workers' ticket managers get no bus, so no process "
                             "combines the others' operations (every contended claim "
                             "goes through the announcements, as before the combiner)")
    args = parser.parse_args(argv)
    combine = args.combine == "on"
    announce = args.announce == "on"

    async with running_nats_server() as server:
        nats_kv = await NatsKV.connect(NatsSettings(servers=[server.url]))
        await publish_state(nats_kv)
        memory_floor = await floor(MemoryKV(), args.samples)
        nats_floor, claims, reading = await uncontended(nats_kv, args.samples)
        await nats_kv.close()
        print(f"floor NATS get+update   p50 {ms(statistics.median(nats_floor))} ms, "
              f"p99 {ms(percentile(nats_floor, 0.99))} ms")
        print(f"floor memory get+update p50 {ms(statistics.median(memory_floor))} ms, "
              f"p99 {ms(percentile(memory_floor, 0.99))} ms")
        ratio = percentile(claims, 0.99) / percentile(nats_floor, 0.99)
        reading_ratio = percentile(reading, 0.99) / percentile(nats_floor, 0.99)
        print(f"claim+release (NATS, uncontended, caller's state) "
              f"p50 {ms(statistics.median(claims))} ms, "
              f"p99 {ms(percentile(claims, 0.99))} ms, p99/floor p99 {ratio:.2f}")
        print(f"claim+release (NATS, uncontended, state read per claim) "
              f"p50 {ms(statistics.median(reading))} ms, "
              f"p99 {ms(percentile(reading, 0.99))} ms, p99/floor p99 {reading_ratio:.2f}")
        loop = asyncio.get_running_loop()
        figures = await loop.run_in_executor(
            None, contended, server.url, args.claimers, args.processes, args.seconds,
            announce, args.count_requests, args.profile, combine,
        )
        print(f"contended: {args.claimers} claimers in {args.processes} processes "
              f"(one NATS connection each) for {args.seconds} s: {figures}")
        spread: dict[str, Any] = {}
        if args.many_processes:
            many = min(args.many_processes, args.claimers)
            spread = await loop.run_in_executor(
                None, contended, server.url, args.claimers, many, args.seconds, announce,
                args.count_requests, args.profile, combine,
            )
            print(f"contended: {args.claimers} claimers in {many} processes "
                  f"(one NATS connection each) for {args.seconds} s: {spread}")
            if args.profile:
                print_profile(sorted(glob.glob(f"{args.profile}/p{many}-*.pstats")))
    return {
        "overcommits": figures["overcommits"],
        "uncontendedP99Ratio": round(ratio, 2),
        "uncontendedReadStateP99Ratio": round(reading_ratio, 2),
        "contendedClaimsPerSecond": figures["claimsPerSecond"],
        "contendedP99Ms": figures["p99Ms"],
        "contendedProcesses": args.processes,
        "contendedRejected": figures["rejected"],
        "contendedConflicts": figures["conflicts"],
        "contendedReleaseFailures": figures["releaseFailures"],
        "fairness": figures["fairness"],
        "natsFloorP99Ms": ms(percentile(nats_floor, 0.99)),
        "memoryFloorP99Ms": ms(percentile(memory_floor, 0.99)),
        "uncontendedP99Ms": ms(percentile(claims, 0.99)),
        "workerCpuMsPerClaim": figures["workerCpuMsPerClaim"],
        **({
            "fairnessProcesses": spread["fairness"],
            "claimsPerSecondProcesses": spread["claimsPerSecond"],
            "p99MsProcesses": spread["p99Ms"],
            "overcommitsProcesses": spread["overcommits"],
            "workerCpuMsPerClaimProcesses": spread["workerCpuMsPerClaim"],
            **({"requestsPerClaimProcesses": spread["requestsPerClaim"],
                "wakeUpsPerClaimProcesses": wake_ups(spread["requestsPerClaim"])}
               if args.count_requests else {}),
        } if spread else {}),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1:]))))
