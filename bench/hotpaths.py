"""Where the time goes on each hot path: a cProfile table of self time by function.

Paths (``--path``, repeatable; all by default):

* ``schedule`` — one operator-side pass at ten times the bench's default cluster
  (50,000 Agents × 500 Models × 1,000 ModelProviders × 50 policies, ``bench/schedule.py``'s
  generator); ``filing`` and ``schedule-filed`` are its two parts as ``bench/schedule.py``
  times them: filing the 50,000 Agents in a roster, and a pass given that roster;
  ``schedule-floor`` is that bench's floor on the same cluster (every policy's require
  selectors against every Model once), the denominator of its ratios;
* ``place`` — place + claim + release on the embedded store with 1,000 providers
  (``bench/place.py``'s fleet);
* ``place-nats`` — the same on a real nats-server with 8 providers (``bench/place.py``'s
  NATS loop): the placement's own work between its two writes, beside the NATS client's;
* ``place-calls`` — the same NATS loop counted by ``sys.setprofile``: the Python and
  builtin calls per place + claim + release made under each part of the call (the
  placement, the ticket lane, the writes, the deliveries of the call's own writes),
  each counted with everything below it, and per floor ``get`` + ``update``;
* ``claims`` — ticket claim + release on one provider on the embedded store (the CAS loop
  without the network, so the client's own work shows);
* ``simulate`` — the simulator running the kubemoot policy alone on ``fleet-16``.

* ``gateway`` — the gateway process under py-spy (``pip install -e '.[bench]'``) while 32
  clients post ``/api/chat`` and ``/v1/chat/completions`` through it to a zero-delay
  emulator (``bench/gateway.py``'s set-up); shares come from py-spy's samples (leaf frames
  for self time), not from cProfile. Skipped when py-spy is missing.
* ``gateway-instructions`` — the same gateway run under valgrind's callgrind: the machine
  instructions it executes per call on each route, one client posting ``--calls`` calls
  in a row after a warm-up. Unlike time, an instruction count hardly moves with the
  machine's load, so it compares two versions of the gateway on a shared machine. Skipped
  when valgrind is missing.
* ``place-instructions`` — place + claim + release on a real nats-server (``bench/place.py``'s
  NATS loop, 8 providers) and the floor that bench divides by (one raw ``get`` +
  ``update``), each under callgrind: the instructions of this process per operation, as
  the count of a run of ``--calls`` operations after the set-up minus that of a run of
  the set-up alone, over ``--calls`` (the nats-server process is not counted; the
  demand board is read once, as its once-a-second re-read would otherwise land every
  few calls under callgrind's slowdown). Their quotient is the CPU side of
  ``natsP99Ratio`` with the machine's load taken out.
  Skipped when valgrind is missing.

With ``--instructions``, each Python path is also run once under valgrind's callgrind,
counted from after its set-up to its end (``instructions`` in its JSON entry).

For each path it prints the top ``--top`` functions by self time with their share of the
profiled time. The last line is one JSON object: for each path, its profiled seconds and
the top functions' shares (``{"schedule": {"seconds": …, "calls": …, "top": [[function,
share], …]}}``). Shares are steadier than seconds on a shared machine; the profiler's own
overhead inflates small functions, so read the table for where to look, and ``bench/*.py``
for figures. ``calls`` counts the Python function calls of the profiled work (C functions
called from Python included): it does not vary from run to run on the same code.

    python bench/hotpaths.py [--path schedule --path place ...] [--top 12] [--instructions]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import random
import sys
import time
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


def _schedule_parts() -> tuple[Callable[[], None], Callable[[], None]]:
    """The ``schedule`` pass's two parts: filing its Agents, and a pass given them filed."""
    import schedule as bench  # bench/schedule.py

    bundle = bench.generate(random.Random(7), agents=50_000, models=500, providers=1000,
                            policies=50)
    roster = bench.AgentRoster(bundle.agents)
    bench.schedule_bundle(bench.ClusterSnapshot.from_bundle(bundle, roster=roster),
                          now=bench.NOW)  # first-use costs stay out; segments are kept

    def filing() -> None:
        # As bench/schedule.py times it: every namespace put in name order.
        for segment in bench.AgentRoster(bundle.agents).segments():
            _ = segment.agents

    def filed() -> None:
        bench.schedule_bundle(bench.ClusterSnapshot.from_bundle(bundle, roster=roster),
                              now=bench.NOW)

    return filing, filed


def _schedule_floor() -> Callable[[], None]:
    """``bench/schedule.py``'s floor on the same cluster: every policy's require selectors
    against every Model once. The ``schedule`` paths' counts over this one are the
    ratios that bench times, with the machine's load taken out."""
    import schedule as bench  # bench/schedule.py

    bundle = bench.generate(random.Random(7), agents=50_000, models=500, providers=1000,
                            policies=50)
    bench.floor_seconds(bundle)  # first-use costs stay out

    def run() -> None:
        bench.floor_seconds(bundle)

    return run


def _filing() -> Callable[[], None]:
    return _schedule_parts()[0]


def _schedule_filed() -> Callable[[], None]:
    return _schedule_parts()[1]


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


def _place_nats() -> Callable[[], None]:
    import place as bench  # bench/place.py

    from kubemoot.settings import NatsSettings
    from kubemoot.store.nats import NatsKV
    from kubemoot.testing.nats_server import running_nats_server

    loop = asyncio.new_event_loop()
    running = running_nats_server()
    server = loop.run_until_complete(running.__aenter__())
    kv = loop.run_until_complete(NatsKV.connect(NatsSettings(servers=[server.url])))
    rng = random.Random(11)
    planner = loop.run_until_complete(bench.build(kv, 8, rng))
    loop.run_until_complete(bench.loop(planner, 200, rng))

    def close() -> None:
        loop.run_until_complete(kv.close())
        loop.run_until_complete(running.__aexit__(None, None, None))

    def run() -> None:
        loop.run_until_complete(bench.loop(planner, 1000, rng))

    run.close = close  # type: ignore[attr-defined]  # after the profile: no placement work
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


def gateway_profile(top: int, seconds: float = 15.0) -> dict[str, Any] | None:
    """Sample the gateway process with py-spy while clients drive it; shares by leaf frame."""
    import shutil
    import subprocess
    import tempfile

    import gateway as bench  # bench/gateway.py

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("\ngateway: py-spy not installed (pip install -e '.[bench]'), skipped")
        return None
    emulator_port, gateway_port = bench.free_port(), bench.free_port()
    card = "vramMiB=24576,numParallel=32,contextLength=4096"
    fast = [sys.executable, "-c", bench._FAST_EMULATOR, "24576", "32", str(emulator_port)]
    front = bench.gateway([f"gpu=http://127.0.0.1:{emulator_port},{card}"], gateway_port)
    with bench.servers(fast, front) as (_, through), tempfile.TemporaryDirectory() as scratch:
        pid = _listener_pid(gateway_port)
        raw = Path(scratch) / "gateway.txt"
        spy_run = subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200",
             "--duration", str(int(seconds)), "--nonblocking", "-o", str(raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

        async def drive() -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and spy_run.poll() is None:
                for route in ("ollama", "openai"):
                    await bench.throughput(through, 1.0, 32, route)

        asyncio.run(drive())
        spy_run.wait(timeout=60)
        return _leaf_shares("gateway", raw.read_text(), top)


def gateway_instructions(calls: int) -> dict[str, Any] | None:
    """Instructions per call of the gateway process on each route, counted by callgrind."""
    import os
    import shutil
    import subprocess
    import tempfile

    from wires import Wire, request_bytes

    import gateway as bench  # bench/gateway.py

    valgrind, control = shutil.which("valgrind"), shutil.which("callgrind_control")
    if valgrind is None or control is None:
        print("\ngateway-instructions: valgrind not installed, skipped")
        return None
    emulator_port, gateway_port = bench.free_port(), bench.free_port()
    card = "vramMiB=24576,numParallel=32,contextLength=4096"
    fast = [sys.executable, "-c", bench._FAST_EMULATOR, "24576", "32", str(emulator_port)]
    # Probes are timed, and callgrind slows the gateway fifty-fold: a long interval keeps
    # them (one after start-up) out of the counted calls.
    front = bench.gateway([f"gpu=http://127.0.0.1:{emulator_port},{card}"], gateway_port,
                          "--probe-interval", "1h")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    figures: dict[str, Any] = {}
    with bench.servers(fast), tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        process = subprocess.Popen(
            [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", *bench.KUBEMOOT,
             *front], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        through = f"http://127.0.0.1:{gateway_port}"
        try:
            bench._wait_up(through, process, seconds=600)

            async def post(route: str, count: int) -> None:
                path, body = bench.ROUTES[route]
                request = request_bytes(through, path, body)
                wire = await Wire.open(through)
                try:
                    for _ in range(count):
                        if (status := await wire.call(request)) != 200:
                            raise SystemExit(f"gateway-instructions: {route} answered {status}")
                finally:
                    wire.close()

            for route in bench.ROUTES:
                asyncio.run(post(route, 50))  # warm: model loaded, caches filled
                subprocess.run([control, "--zero", str(process.pid)], check=True,
                               capture_output=True)
                asyncio.run(post(route, calls))
                subprocess.run([control, "--dump", str(process.pid)], check=True,
                               capture_output=True)
                dumps = sorted(Path(scratch).glob("callgrind.out*"),
                               key=lambda p: p.stat().st_mtime)
                figures[route] = _instructions(dumps[-1]) / calls
                print(f"gateway-instructions: {route} route, {calls} calls in a row: "
                      f"{figures[route] / 1e6:.3f} M instructions per call")
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    return {"instructionsPerCall": round(figures["ollama"]),
            "instructionsPerCallOpenAI": round(figures["openai"]), "calls": calls}


def place_instructions(calls: int) -> dict[str, Any] | None:
    """Instructions per place + claim + release on NATS, and per floor get + update."""
    import os
    import shutil
    import subprocess
    import tempfile

    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("\nplace-instructions: valgrind not installed, skipped")
        return None
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mode, count in (("setup", 0), ("call", calls), ("floor", calls)):
            out = Path(scratch) / f"callgrind.{mode}"
            subprocess.run(
                [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                 str(Path(__file__).resolve()), "--place-child", mode, str(count)],
                env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            counts[mode] = _instructions(out)
    per_call = (counts["call"] - counts["setup"]) / calls
    per_floor = (counts["floor"] - counts["setup"]) / calls
    print(f"\nplace-instructions: {calls} operations each after the set-up: "
          f"{per_call / 1e6:.3f} M instructions per place + claim + release on NATS, "
          f"{per_floor / 1e6:.3f} M per floor get + update ({per_call / per_floor:.2f}x)")
    return {"instructionsPerCall": round(per_call), "instructionsPerFloor": round(per_floor),
            "ratio": round(per_call / per_floor, 3), "calls": calls}


#: The parts of a call on NATS that ``place-calls`` reports: (label, file, function).
_PLACE_PARTS = (
    ("placement (CallPlanner.place, its claim included)", "runtime/planner.py", "place"),
    ("its claim (Claims.claim)", "runtime/claims.py", "claim"),
    ("release (CallPlanner.release)", "runtime/planner.py", "release"),
    ("of which the release sent (TicketManager.release_sent)", "runtime/tickets.py",
     "release_sent"),
    ("the bench's wait for the lanes to settle (TicketManager.quiet)", "runtime/tickets.py",
     "quiet"),
    ("a sent release's outcome (TicketManager._sent_settled)", "runtime/tickets.py",
     "_sent_settled"),
    ("ticket lane (TicketManager._serve, its writes included)", "runtime/tickets.py",
     "_serve"),
    ("the writes (NatsBucket.update)", "store/nats.py", "update"),
    ("an idle lane's round in its caller's turn (TicketManager._write_at_once)",
     "runtime/tickets.py", "_write_at_once"),
    ("its write sent (NatsBucket.update_then)", "store/nats.py", "update_then"),
    ("its acknowledgement heard (TicketManager._heard)", "runtime/tickets.py", "_heard"),
    ("nats-py reading the socket (Client._read_loop)", "nats/aio/client.py", "_read_loop"),
    ("nats-py subscription tasks (Subscription._wait_for_msgs)", "nats/aio/subscription.py",
     "_wait_for_msgs"),
    ("a write's acknowledgement to its waiter (_Acks._take)", "store/nats.py", "_take"),
    ("a delivery to the watch (take)", "store/nats.py", "take"),
    ("the view's watch task (ProviderView._follow)", "runtime/view.py", "_follow"),
    ("nats-py's flusher task (Client._flusher)", "nats/aio/client.py", "_flusher"),
)


def place_calls(calls: int) -> dict[str, Any]:
    """Python and builtin calls per place + claim + release on NATS, by part."""
    import place as bench  # bench/place.py

    from kubemoot.settings import NatsSettings
    from kubemoot.store.nats import NatsKV
    from kubemoot.testing.nats_server import running_nats_server

    def counting(counts: dict[str, int]) -> Callable[[Any, str, Any], None]:
        def tally(frame: Any, event: str, _arg: Any) -> None:
            if event not in ("call", "c_call"):
                return
            counts["all"] = counts.get("all", 0) + 1
            seen: set[str] = set()
            while frame is not None:
                code = frame.f_code
                for label, path, function in _PLACE_PARTS:
                    if code.co_name == function and code.co_filename.endswith(path):
                        seen.add(label)
                frame = frame.f_back
            for label in seen:
                counts[label] = counts.get(label, 0) + 1
        return tally

    async def counted(work: Callable[[], Any], counts: dict[str, int]) -> None:
        sys.setprofile(counting(counts))
        try:
            await work()
        finally:
            sys.setprofile(None)

    per_call: dict[str, int] = {}
    per_floor: dict[str, int] = {}

    async def run() -> None:
        async with running_nats_server() as server:
            kv = await NatsKV.connect(NatsSettings(servers=[server.url]))
            try:
                rng = random.Random(11)
                planner = await bench.build(kv, 8, rng)
                floor = await bench.floor_bucket(kv)
                # each call let settle as bench/place.py's NATS loop does
                await bench.loop(planner, 200, rng, settles=[])  # warm-up

                async def place() -> None:
                    await bench.loop(planner, calls, rng, settles=[])

                async def floors() -> None:
                    for _ in range(calls):
                        await bench.round_trip(floor)

                await counted(place, per_call)
                await counted(floors, per_floor)
            finally:
                await kv.close()

    asyncio.run(run())
    print(f"\nplace-calls: Python and builtin calls per place + claim + release on NATS "
          f"({calls} calls), each part counted with everything below it:")
    for label, _path, _function in _PLACE_PARTS:
        print(f"  {per_call.get(label, 0) / calls:7.0f}  {label}")
    print(f"  {per_call.get('all', 0) / calls:7.0f}  all; per floor get + update: "
          f"{per_floor.get('all', 0) / calls:.0f}")
    return {"perCall": round(per_call.get("all", 0) / calls, 1),
            "perFloor": round(per_floor.get("all", 0) / calls, 1),
            "parts": {label: round(per_call.get(label, 0) / calls, 1)
                      for label, _path, _function in _PLACE_PARTS}}


def _place_child(mode: str, count: int) -> None:
    """The process ``place_instructions`` counts: set-up and warm-up, then ``count``
    calls (``call``) or floor round trips (``floor``), or nothing more (``setup``)."""
    import place as bench  # bench/place.py

    from kubemoot.settings import NatsSettings, RuntimeSettings
    from kubemoot.store.nats import NatsKV
    from kubemoot.testing.nats_server import running_nats_server

    async def run() -> None:
        async with running_nats_server() as server:
            # callgrind slows this process fifty-fold: no request may time out
            kv = await NatsKV.connect(NatsSettings(servers=[server.url], request_timeout=60.0))
            try:
                rng = random.Random(11)
                # The demand board is read once: callgrind's slowdown would otherwise
                # bring its once-a-second re-read into every few calls.
                planner = await bench.build(kv, 8, rng,
                                            RuntimeSettings(demand_cache_seconds=3600.0))
                floor = await bench.floor_bucket(kv)
                await bench.loop(planner, 50, rng, settles=[])  # warm-up
                for _ in range(50):
                    await bench.round_trip(floor)
                if mode == "call":
                    await bench.loop(planner, count, rng, settles=[])
                elif mode == "floor":
                    for _ in range(count):
                        await bench.round_trip(floor)
            finally:
                await kv.close()

    asyncio.run(run())


def _instructions(dump: Path) -> int:
    """The total instruction count (Ir) of one callgrind dump."""
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"{dump}: no totals in the callgrind dump")


def _listener_pid(port: int) -> int:
    """The process listening on a loopback port (the gateway ``servers`` started)."""
    import subprocess

    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split("pid=", 1)[1].split(",", 1)[0])


def _leaf_shares(name: str, collapsed: str, top: int) -> dict[str, Any]:
    """Self-time shares from py-spy's collapsed stacks ("frame;frame;leaf count" lines)."""
    functions: dict[str, int] = {}
    modules: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]  # "function (path/to/file.py:line)"
        function, _, where = leaf.partition(" (")
        path = where.rstrip(")").rsplit(":", 1)[0]
        for marker in ("/src/", "site-packages/", "/python3.11/", "/python3.12/"):
            if marker in path:
                path = path.split(marker)[-1]
                break
        label = f"{path}({function})"
        module = path.removesuffix(".py").replace("/", ".")
        functions[label] = functions.get(label, 0) + int(count)
        modules[module] = modules.get(module, 0) + int(count)
        total += int(count)
    total = max(total, 1)
    rows = sorted(((c, f) for f, c in functions.items()), reverse=True)
    by_module = sorted(((c, m) for m, c in modules.items()), reverse=True)
    print(f"\n{name}: {total} py-spy samples; top {top} functions by self time")
    for count, label in rows[:top]:
        print(f"  {100 * count / total:5.1f} %  {label}")
    print(f"{name}: top {top} modules by self time")
    for count, module in by_module[:top]:
        print(f"  {100 * count / total:5.1f} %  {module}")
    return {"samples": total,
            "top": [[label, round(c / total, 3)] for c, label in rows[:top]],
            "modules": [[m, round(c / total, 3)] for c, m in by_module[:top]]}


PATHS: dict[str, Callable[[], Callable[[], None]]] = {
    "schedule": _schedule,
    "filing": _filing,
    "schedule-filed": _schedule_filed,
    "schedule-floor": _schedule_floor,
    "place": _place,
    "place-nats": _place_nats,
    "claims": _claims,
    "simulate": _simulate,
}


def profile(name: str, top: int) -> dict[str, Any]:
    work = PATHS[name]()
    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    close = getattr(work, "close", None)  # what a path tears down outside the profile
    if close is not None:
        close()
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
    calls = int(stats.total_calls)  # type: ignore[attr-defined]
    print(f"\n{name}: {total:.2f} s profiled, {calls:,} Python calls; top {top} functions by "
          "self time")
    for self_time, label in rows[:top]:
        print(f"  {100 * self_time / total:5.1f} %  {label}")
    print(f"{name}: top {top} modules by self time")
    for self_time, module in by_module[:top]:
        print(f"  {100 * self_time / total:5.1f} %  {module}")
    return {"seconds": round(total, 3), "calls": calls,
            "top": [[label, round(t / total, 3)] for t, label in rows[:top]],
            "modules": [[m, round(t / total, 3)] for t, m in by_module[:top]]}


#: Callgrind's client requests, called through ctypes: instructions are counted from
#: ``start`` to ``stop`` only, so a path's set-up (a 50,000-Agent cluster takes seconds)
#: runs uninstrumented and fast.
_SHIM = r"""
#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
"""


def instructions(name: str) -> int | None:
    """The instructions one run of a path executes after its set-up (valgrind's callgrind).

    Unlike time, the count hardly moves with the machine's load, and unlike a count of
    Python calls it sees the work done inside C calls (a list append, a dict store).
    Needs valgrind, its headers and a C compiler; skipped without them.
    """
    import os
    import shutil
    import subprocess
    import tempfile

    valgrind, compiler = shutil.which("valgrind"), shutil.which("cc") or shutil.which("gcc")
    if valgrind is None or compiler is None:
        print(f"\n{name} instructions: valgrind or a C compiler missing, skipped")
        return None
    with tempfile.TemporaryDirectory() as scratch:
        source, shim = Path(scratch) / "shim.c", Path(scratch) / "shim.so"
        source.write_text(_SHIM)
        built = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(shim),
                                str(source)], capture_output=True, text=True, check=False)
        if built.returncode != 0:
            print(f"\n{name} instructions: callgrind.h missing ({built.stderr.strip()[:80]}), "
                  "skipped")
            return None
        out = Path(scratch) / "callgrind.out"
        # A fixed string hash: dicts of names then collide alike on every run.
        subprocess.run([valgrind, "--tool=callgrind", "--instr-atstart=no",
                        f"--callgrind-out-file={out}", sys.executable, __file__,
                        "--measure", name, "--shim", str(shim)],
                       check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
        dumps = sorted(Path(scratch).glob("callgrind.out.*"))
        if not dumps:
            raise SystemExit(f"{name} instructions: callgrind wrote no dump")
        # The dump's "totals" line: its "summary" line stays 0 after a zeroing request.
        totals = [line for line in dumps[0].read_text().splitlines()
                  if line.startswith("totals:")]
        if not totals:
            raise SystemExit(f"{dumps[0]}: no totals in the callgrind dump")
        count = int(totals[0].split()[1])
    print(f"\n{name}: {count:,} instructions in one run (callgrind)")
    return count


def _measure(name: str, shim: str) -> None:
    """In the child process under callgrind: set the path up, then run it counted."""
    import ctypes
    import gc

    work = PATHS[name]()
    gc.collect()  # the same start for every run: no collection owed by the set-up
    counted = ctypes.CDLL(shim)
    counted.start()
    work()
    counted.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="append",
                        choices=[*sorted(PATHS), "gateway", "gateway-instructions",
                                 "place-instructions", "place-calls"],
                        help="a hot path to profile (repeatable; default: all)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--calls", type=int, default=300,
                        help="calls per route counted by gateway-instructions, and "
                        "operations of each kind counted by place-instructions")
    parser.add_argument("--place-child", nargs=2, metavar=("MODE", "COUNT"),
                        help=argparse.SUPPRESS)  # the process place-instructions counts
    parser.add_argument("--instructions", action="store_true",
                        help="also count each Python path's instructions under callgrind")
    parser.add_argument("--measure", choices=sorted(PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--shim", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.place_child is not None:
        _place_child(args.place_child[0], int(args.place_child[1]))
        return
    if args.measure:
        _measure(args.measure, args.shim)
        return
    figures: dict[str, Any] = {}
    for name in args.path or [*PATHS, "gateway"]:
        if name == "gateway":
            figures[name] = gateway_profile(args.top)
        elif name == "gateway-instructions":
            figures[name] = gateway_instructions(args.calls)
        elif name == "place-instructions":
            figures[name] = place_instructions(args.calls)
        elif name == "place-calls":
            figures[name] = place_calls(args.calls)
        else:
            figures[name] = profile(name, args.top)
            if args.instructions:
                figures[name]["instructions"] = instructions(name)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
