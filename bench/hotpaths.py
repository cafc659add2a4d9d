"""Where the time goes on each hot path: a cProfile table of self time by function.

Paths (``--path``, repeatable; all by default):

* ``schedule`` — one operator-side pass at ten times the bench's default cluster
  (50,000 Agents × 500 Models × 1,000 ModelProviders × 50 policies, ``bench/schedule.py``'s
  generator);
* ``place`` — place + claim + release on the embedded store with 1,000 providers
  (``bench/place.py``'s fleet);
* ``claims`` — ticket claim + release on one provider on the embedded store (the CAS loop
  without the network, so the client's own work shows);
* ``simulate`` — the simulator running the kubemoot policy alone on ``fleet-16``.

The gateway runs in its own process; profile it with py-spy while ``bench/gateway.py``
drives it (``docs/performance.md`` gives the command).

For each path it prints the top ``--top`` functions by self time with their share of the
profiled time. The last line is one JSON object: for each path, its profiled seconds and
the top functions' shares (``{"schedule": {"seconds": …, "top": [[function, share], …]}}``).
Shares are steadier than seconds on a shared machine; the profiler's own overhead inflates
small functions, so read the table for where to look, and ``bench/*.py`` for figures.

    python bench/hotpaths.py [--path schedule --path place ...] [--top 12]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))


def _schedule() -> Callable[[], None]:
    import schedule as bench  # bench/schedule.py

    bundle = bench.generate(random.Random(7), agents=50_000, models=500, providers=1000,
                            policies=50)
    bench.schedule_bundle(bundle, now=bench.NOW)  # first-use costs stay out

    def run() -> None:
        bench.schedule_bundle(bundle, now=bench.NOW)

    return run


def _place() -> Callable[[], None]:
    import place as bench  # bench/place.py

    from kubemoot.store.memory import MemoryKV

    rng = random.Random(7)
    loop = asyncio.new_event_loop()
    kv = MemoryKV()
    planner = loop.run_until_complete(bench.build(kv, 1000, rng))
    loop.run_until_complete(bench.loop(planner, 200, rng))

    def run() -> None:
        loop.run_until_complete(bench.loop(planner, 1000, rng))
        loop.run_until_complete(kv.close())  # ends the view's watches with the store

    return run


def _claims() -> Callable[[], None]:
    from kubemoot.clock import SystemClock
    from kubemoot.runtime.tickets import TicketManager
    from kubemoot.store.documents import (
        PROVIDER_STATE_BUCKET,
        PROVIDER_TICKETS_BUCKET,
        ProviderState,
    )
    from kubemoot.store.memory import MemoryKV

    loop = asyncio.new_event_loop()
    state = ProviderState(provider="gpu-a", endpoint="http://gpu-a:11434", ready=True,
                          total_vram_mib=80 * 1024, max_parallel=4, context_length=8192)

    async def build() -> TicketManager:
        kv = MemoryKV()
        return TicketManager(await kv.bucket(PROVIDER_TICKETS_BUCKET),
                             await kv.bucket(PROVIDER_STATE_BUCKET), clock=SystemClock())

    tickets = loop.run_until_complete(build())

    async def run(count: int) -> None:
        for index in range(count):
            ticket = await tickets.claim("gpu-a", "m", 2048, f"h{index}", provider_state=state)
            await tickets.release("gpu-a", ticket.ticket_id)

    loop.run_until_complete(run(200))
    return lambda: loop.run_until_complete(run(5000))


def _simulate() -> Callable[[], None]:
    from kubemoot.sim import load_scenario
    from kubemoot.sim.simulation import run_policy
    from kubemoot.sim.workload import build_trace

    scenario = load_scenario(ROOT / "examples" / "scenarios" / "fleet-16.yaml")
    trace = build_trace(scenario, seed=scenario.spec.seed)

    def run() -> None:
        # The kubemoot run alone, as simCpuSecondsFor100kCalls counts it (no lower bound).
        run_policy(scenario, trace, "kubemoot", seed=scenario.spec.seed)

    return run


PATHS: dict[str, Callable[[], Callable[[], None]]] = {
    "schedule": _schedule,
    "place": _place,
    "claims": _claims,
    "simulate": _simulate,
}


def profile(name: str, top: int) -> dict[str, Any]:
    work = PATHS[name]()
    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    modules: dict[str, float] = {}
    entries = stats.stats.items()  # type: ignore[attr-defined]
    for (filename, line, function), (_, _, self_time, _, _) in entries:
        where = filename.split("/src/")[-1] if "/src/" in filename else Path(filename).name
        rows.append((self_time, f"{where}:{line}({function})"))
        module = "builtins" if where == "~" else where.removesuffix(".py").replace("/", ".")
        modules[module] = modules.get(module, 0.0) + self_time
    rows.sort(reverse=True)
    by_module = sorted(((t, m) for m, t in modules.items()), reverse=True)
    print(f"\n{name}: {total:.2f} s profiled; top {top} functions by self time")
    for self_time, label in rows[:top]:
        print(f"  {100 * self_time / total:5.1f} %  {label}")
    print(f"{name}: top {top} modules by self time")
    for self_time, module in by_module[:top]:
        print(f"  {100 * self_time / total:5.1f} %  {module}")
    return {"seconds": round(total, 3),
            "top": [[label, round(t / total, 3)] for t, label in rows[:top]],
            "modules": [[m, round(t / total, 3)] for t, m in by_module[:top]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="append", choices=sorted(PATHS),
                        help="a hot path to profile (repeatable; default: all)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    print(json.dumps({name: profile(name, args.top) for name in args.path or list(PATHS)}))


if __name__ == "__main__":
    main()
