"""The simulator's own work on one scenario, counted so that a busy machine cannot blur it.

``bench/quality.py`` prints ``simCpuSecondsFor100kCalls``, the process's CPU seconds per
call; on a shared machine those swing with the load by more than most changes. This
bench counts what the kubemoot run does instead:

* ``pythonCalls`` — the Python function calls of one kubemoot run on the scenario
  (cProfile's total, after a warm-up run so that first-use costs stay out);
* ``cpuSecondsFor100kCalls`` — the run's process CPU time per served call × 100,000,
  unprofiled (noisy: for comparing within one run only);
* ``selfShareByArea`` — where the profiled run's self time went (cProfile), by area:
  the runtime (``kubemoot/runtime``, gates, settings, metrics), the shared documents
  (``store/documents.py``, ``store/keys.py``, pydantic), the loop (asyncio,
  ``sim/vloop.py``, ``clock.py``, contexts), the embedded store (``store/memory.py``,
  ``_watch.py``, ``bus.py``), the engines (``emulation/``, ``sim/gpu.py``), the rest of
  the simulator; a built-in function (``len``, a dict's ``get``) or one of the standard
  library's counts in the area of the function that called it, ``other`` where that is
  one of them too. The profiler's overhead inflates small functions, so read it for
  where to look;
* with ``--decisions``: ``decisions``, a SHA-256 over every decision of the kubemoot runs
  on each scenario asked for (where and when each call ran, how each call ended, every
  load and unload), so a change meant for speed only can show it decides the same;
* with ``--opcodes N``: ``pythonOpcodes``, the bytecode instructions the run's Python
  functions executed (counted by a trace function, so exact and repeatable, but blind to
  the work of C code such as pydantic's or a float's ``repr``), and ``opcodesByFunction``,
  the N functions that executed most of them (their own code, not their callees');
* with ``--callgrind``: the instructions of the run (valgrind's callgrind, repeatable
  under load), as the count of the whole process minus that of the same process with
  the set-up only (imports, the policy's included, the scenario, its trace). The run is
  the process's first, as ``bench/quality.py``'s is: first-use costs count, imports not.

    python bench/simcpu.py [--scenario fleet-16] [--duration S] [--decisions a,b,...]
                           [--opcodes N] [--callgrind]

The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kubemoot.sim import build_trace, load_scenario  # noqa: E402
from kubemoot.sim.scenario import Scenario  # noqa: E402
from kubemoot.sim.simulation import PolicyRun, make_policy, run_policy  # noqa: E402
from kubemoot.sim.workload import Trace  # noqa: E402

SCENARIOS = ROOT / "examples" / "scenarios"
POLICY = "kubemoot"


def _prepare(name: str, duration: float | None) -> tuple[Scenario, Trace]:
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    if duration is not None:
        scenario = scenario.with_duration(duration)
    return scenario, build_trace(scenario, seed=scenario.spec.seed)


def _run(scenario: Scenario, trace: Trace) -> PolicyRun:
    return run_policy(scenario, trace, POLICY, seed=scenario.spec.seed)


def decisions_digest(run: PolicyRun) -> str:
    """Every decision of one run, hashed: a served call's card, model and times, each
    call's ending, each load and unload (``repr`` keeps floats exact)."""
    digest = hashlib.sha256()
    for call in sorted(run.served):
        served = run.served[call]
        digest.update(repr((call, served.card, served.model, served.issued,
                            served.started, served.ended)).encode())
    digest.update(repr(sorted(run.statuses.items())).encode())
    digest.update(repr(run.loads).encode())
    digest.update(repr(run.unloads).encode())
    return digest.hexdigest()


#: (area, what a profiled function's file or name holds), the first that matches
AREAS: tuple[tuple[str, str], ...] = (
    ("documents", "kubemoot/store/documents.py"), ("documents", "kubemoot/store/keys.py"),
    ("documents", "pydantic"),
    ("store", "kubemoot/store/"),
    ("loop", "kubemoot/sim/vloop.py"), ("loop", "kubemoot/clock.py"), ("loop", "asyncio"),
    ("loop", "_weakrefset.py"), ("loop", "_contextvars"),
    ("engines", "kubemoot/emulation/"), ("engines", "kubemoot/sim/gpu.py"),
    ("simulator", "kubemoot/sim/"),
    ("runtime", "kubemoot/"), ("runtime", "prometheus_client"),
)


def area_of(filename: str, name: str) -> str:
    """The area a profiled function belongs to (see ``selfShareByArea``)."""
    where = filename.replace("\\", "/") if filename != "~" else name
    for area, part in AREAS:
        if part in where:
            return area
    return "builtins" if filename == "~" else "other"


def _python_calls(scenario: Scenario, trace: Trace) -> tuple[int, dict[str, float], PolicyRun]:
    profiler = cProfile.Profile()
    run = profiler.runcall(_run, scenario, trace)
    stats = pstats.Stats(profiler)
    by_area: dict[str, float] = {}
    for (filename, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        area = area_of(filename, name)
        if area in ("builtins", "other"):
            # the caller's area: each calling function's share of this one's self time
            for (caller_file, _, caller_name), edge in row[4].items():
                caller = area_of(caller_file, caller_name)
                caller = "other" if caller == "builtins" else caller
                by_area[caller] = by_area.get(caller, 0.0) + edge[2]
        else:
            by_area[area] = by_area.get(area, 0.0) + row[2]  # self time
    total = sum(by_area.values()) or 1.0
    shares = {area: round(t / total, 3)
              for area, t in sorted(by_area.items(), key=lambda kv: -kv[1])}
    return int(stats.total_calls), shares, run  # type: ignore[attr-defined]


def _opcodes(scenario: Scenario, trace: Trace, top: int) -> tuple[int, list[list[Any]]]:
    """The bytecode instructions one run executes, in all and in the ``top`` functions
    that execute most: ``[share, count, calls, "file:line function"]`` each."""
    counts: dict[Any, int] = {}
    calls: dict[Any, int] = {}

    def trace_function(frame: Any, event: str, _arg: Any) -> Any:
        code = frame.f_code
        if event == "opcode":
            counts[code] = counts.get(code, 0) + 1
        elif event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            calls[code] = calls.get(code, 0) + 1
        return trace_function

    sys.settrace(trace_function)
    try:
        _run(scenario, trace)
    finally:
        sys.settrace(None)
    total = sum(counts.values())
    rows = []
    for code, count in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
        where = re.sub(r".*/(src|site-packages|lib/python3\.\d+)/", "", code.co_filename)
        rows.append([round(count / max(total, 1), 4), count, calls.get(code, 0),
                     f"{where}:{code.co_firstlineno} {code.co_qualname}"])
    return total, rows


def _instructions(args: list[str]) -> int:
    """The instructions valgrind's callgrind counts for this script run with ``args``."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, str(Path(__file__).resolve()), *args],
        capture_output=True, text=True, check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{done.stderr[-1000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="fleet-16")
    parser.add_argument("--duration", type=float, default=None,
                        help="cut the scenario to this many seconds (a quick run)")
    parser.add_argument("--decisions", default=None,
                        help="comma-separated scenarios whose decisions are hashed")
    parser.add_argument("--opcodes", type=int, default=None, metavar="N",
                        help="count the run's bytecode instructions; list the top N functions")
    parser.add_argument("--callgrind", action="store_true",
                        help="count the run's instructions under valgrind (slow)")
    # the child processes of --callgrind: set-up only, or set-up and one run
    parser.add_argument("--stage", choices=("setup", "run"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage is not None:
        # Both stages import what the policy imports (the whole runtime, for kubemoot),
        # so the difference is the run alone, as bench/quality.py's clock counts it.
        make_policy(POLICY)
        scenario, trace = _prepare(args.scenario, args.duration)
        if args.stage == "run":
            _run(scenario, trace)
        return

    figures: dict[str, Any] = {"scenario": args.scenario}
    scenario, trace = _prepare(args.scenario, args.duration)
    _run(scenario, trace)  # warm-up: imports and first-use caches stay out of the counts
    started = time.process_time()
    run = _run(scenario, trace)
    cpu = time.process_time() - started
    served = max(len(run.served), 1)
    figures["servedCalls"] = len(run.served)
    figures["cpuSecondsFor100kCalls"] = round(cpu / served * 100_000, 1)
    calls, shares, profiled = _python_calls(scenario, trace)
    if decisions_digest(profiled) != decisions_digest(run):
        raise SystemExit("two runs of one trace decided differently: the run is not "
                         "deterministic, so no figure here can be compared")
    figures["pythonCalls"] = calls
    figures["selfShareByArea"] = shares
    if args.decisions:
        digest = hashlib.sha256()
        for name in args.decisions.split(","):
            one = decisions_digest(_run(*_prepare(name.strip(), args.duration)))
            figures.setdefault("decisionsByScenario", {})[name.strip()] = one[:16]
            digest.update(one.encode())
        figures["decisions"] = digest.hexdigest()[:16]
    if args.opcodes is not None:
        figures["pythonOpcodes"], figures["opcodesByFunction"] = _opcodes(
            scenario, trace, args.opcodes)
    if args.callgrind:
        if shutil.which("valgrind") is None:
            raise SystemExit("--callgrind needs valgrind on the PATH")
        base = ["--scenario", args.scenario]
        if args.duration is not None:
            base += ["--duration", str(args.duration)]
        whole = _instructions([*base, "--stage", "run"])
        setup = _instructions([*base, "--stage", "setup"])
        figures["instructions"] = whole - setup
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
