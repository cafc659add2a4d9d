"""What the gateway adds to a call, and whether replicas overcommit a card.

* **Added latency**: one client, a warm model, an emulator with no emulated delay
  (``--time-scale 0``): each route (Ollama's ``/api/chat``, OpenAI's
  ``/v1/chat/completions``) straight to the emulator and through the gateway, sampled in
  turns so load from elsewhere weighs on both alike; the figures are the gateway's p50
  and p99 minus the direct ones (goal: p50 ≤ 2 ms on both routes).
* **Throughput**: requests per second at 32 concurrent clients, through the gateway
  and direct, on each route (goal: ratio ≥ 0.8).
* **CPU per call**: the gateway's own CPU seconds (user + system, from ``/proc``) over
  the calls it answered in the throughput run, and the engine's in the direct run. On a
  machine shared with other work the rates move with the neighbours' load; the CPU a
  call costs moves far less, so before/after comparisons read this one first.
* **User and system CPU per call, apart** (``--cpu-only``, that alone): the gateway's
  over ``--seconds`` per route with ``--clients`` clients, no direct or latency run
  (``gatewayUserMsPerCall``, ``gatewaySystemMsPerCall``, ``…OpenAI``); system calls
  saved show in the second, which neither cProfile nor callgrind counts.
* **Python calls per call** (``--count-calls N``, that alone): the gateway under
  cProfile, N calls in a row per route after a warm-up; the function calls it counts
  per call do not move with the machine's load (``pythonCallsPerCall``,
  ``pythonCallsPerCallOpenAI``; split by package and by part of the call in the lines
  it prints), the cycle collector's passes per 1,000 of those
  calls, all generations (``collectionsPer1000Calls``, ``…OpenAI``), and the times per
  call something asked asyncio for the running loop (``loopAsksPerCall``, ``…OpenAI``;
  on Python 3.11 each is a getpid system call). With ``--count-clients C`` (C > 1) the
  counted calls are those ``C`` clients get answered in ``--seconds`` per route instead
  (``calls`` is then their number): a call among 32 in flight costs more than one alone
  (every snapshot and ticket document then holds the others' tickets), and this count
  shows where.
* **Against LiteLLM**: when LiteLLM's proxy is found (``--litellm PATH``, else beside
  this Python or on PATH; install it in a virtual environment of its own, ``python3 -m
  venv /tmp/litellm && /tmp/litellm/bin/pip install 'litellm[proxy]'``, since it pins
  releases of uvicorn and starlette too old for the gateway), the same two measurements
  through it, in front of the same emulator: upstream ``openai/`` to the emulator's
  ``/v1`` (the OpenAI route) and ``ollama_chat/`` to its ``/api/chat`` (the Ollama
  route; LiteLLM's own clients speak only the OpenAI API). ``addedP50MsVsLiteLLM`` is
  our added p50 over LiteLLM's on the worse route, ``throughputVsLiteLLM`` our requests
  per second over LiteLLM's on the worse route (below 1 and above 1 are better,
  respectively).
* **Overcommits**: two gateway replicas sharing a real nats-server in front of two
  small emulated cards, many concurrent calls over three models, a third of them with a
  client ``keep_alive`` of one second (the engine would unload those copies between two
  probes if the gateway let it); the engines' ``/emulator/stats`` count every model they
  had to evict on their own and every card that went over its memory (goal: 0).

Every server is its own process (``kubemoot emulate-ollama``, ``kubemoot gateway``,
``litellm``), as in a deployment. Human-readable lines first; the last line is one JSON
object: ``{"addedP50Ms": …, "addedP99Ms": …, "throughputRatio": …, "addedP50MsOpenAI": …,
"throughputRatioOpenAI": …, "gatewayCpuMsPerCall": …, "gatewayCpuMsPerCallOpenAI": …,
"engineCpuMsPerCall": …, "addedP50MsVsLiteLLM": …, "throughputVsLiteLLM": …,
"overcommits": …}`` (the LiteLLM keys only when it ran).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from wires import Wire, Wires, request_bytes, run  # noqa: E402  (bench/wires.py)

from kubemoot.testing.nats_server import NatsServer, free_port  # noqa: E402

KUBEMOOT = [sys.executable, "-c", "from kubemoot.cli import main; main()"]
#: The process behind each URL ``servers`` started (for its CPU time).
PIDS: dict[str, int] = {}
MODEL = "qwen3:8b"
BODY = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]}


@contextmanager
def servers(*commands: list[str]) -> Iterator[list[str]]:
    """Start each command (its port is its last argument); yield their URLs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    processes = [subprocess.Popen(c if c[0] == sys.executable else [*KUBEMOOT, *c],
                                  env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for c in commands]
    try:
        urls = [f"http://127.0.0.1:{c[-1].rsplit(':', 1)[-1]}" for c in commands]
        for url, process in zip(urls, processes, strict=True):
            _wait_up(url, process)
            PIDS[url] = process.pid
        yield urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_up(url: str, process: subprocess.Popen[bytes], path: str = "/",
             seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{url}: the server exited with {process.returncode}")
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise SystemExit(f"{url} never came up")


def emulator(port: int, *, vram: int, parallel: int, time_scale: float) -> list[str]:
    return ["emulate-ollama", "--vram-mib", str(vram), "--num-parallel", str(parallel),
            "--context-length", "4096", "--time-scale", str(time_scale),
            "--port", str(port)]


# The emulator's own listening socket leaves Nagle on (it is created without
# IPPROTO_TCP), which adds a delayed ACK (~40 ms) to every keep-alive request. For the
# latency figures the emulator's app is served by uvicorn's own bind instead, so the
# baseline is the engine and not that artefact. Its loop and parser are pinned (asyncio,
# h11) so that installing uvloop or httptools, which uvicorn would otherwise pick up,
# leaves the baseline as it was: before/after figures compare the gateway alone.
_FAST_EMULATOR = """
import sys, uvicorn
from kubemoot.emulation.server import EmulatorConfig, OllamaEmulator
config = EmulatorConfig(vram_mib=int(sys.argv[1]), num_parallel=int(sys.argv[2]),
                        context_length=4096, time_scale=0.0)
uvicorn.run(OllamaEmulator(config).app, host="127.0.0.1", port=int(sys.argv[3]),
            log_level="error", lifespan="off", access_log=False, loop="asyncio", http="h11")
"""


# The gateway under cProfile, counting only between SIGUSR1 and SIGUSR2 (start-up and the
# warm-up calls are left out); the stats go to the file named by the first argument, and
# the cycle collector's passes by generation over the same calls to that name + ".gc".
_PROFILED_GATEWAY = """
import cProfile, gc, json, signal, sys
from kubemoot.cli import main
out, sys.argv = sys.argv[1], ["kubemoot", *sys.argv[2:]]
profile, passes = cProfile.Profile(), []
def start(*_):
    global profile, passes
    passes = [g["collections"] for g in gc.get_stats()]
    profile = cProfile.Profile()
    profile.enable()
def stop(*_):
    profile.disable()
    done = [g["collections"] - p for g, p in zip(gc.get_stats(), passes)]
    with open(out + ".gc", "w") as f:
        json.dump(done, f)
    profile.dump_stats(out)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
main()
"""


async def python_calls(calls: int, keep: Path | None = None, *, clients: int = 1,
                       seconds: float = 5.0) -> dict[str, float]:
    """Python function calls the gateway makes per call, one client, on each route.

    cProfile counts every Python function entered and every C function called from
    Python (a coroutine is counted again each time it resumes), so the figure does not
    move with the machine's load: the count to compare two versions by, beside the
    CPU milliseconds that do. Probes are an hour apart, so none lands among the calls.
    """
    import pstats

    emulator_port, gateway_port = free_port(), free_port()
    card = "vramMiB=24576,numParallel=32,contextLength=4096"
    fast = [sys.executable, "-c", _FAST_EMULATOR, "24576", "32", str(emulator_port)]
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "gateway.prof"
        front = [sys.executable, "-c", _PROFILED_GATEWAY, str(out),
                 *gateway([f"gpu=http://127.0.0.1:{emulator_port},{card}"], gateway_port,
                          "--probe-interval", "1h")]
        with servers(fast, front) as (_direct, through):
            pid = PIDS[through]
            for route, (path, body) in ROUTES.items():
                request = request_bytes(through, path, body)
                wire = await Wire.open(through)
                try:
                    for _ in range(50):  # warm: model loaded, caches filled
                        _answered(through, await wire.call(request))
                    if clients > 1:  # every client's connection open, tickets in flight
                        await _drive(through, 1.0, clients, route)
                    out.unlink(missing_ok=True)
                    os.kill(pid, signal.SIGUSR1)
                    await asyncio.sleep(0.3)
                    if clients > 1:
                        # each client's last call is answered before drive returns
                        _rate, answered = await _drive(through, seconds, clients, route)
                    else:
                        for _ in range(calls):
                            _answered(through, await wire.call(request))
                        answered = calls
                    os.kill(pid, signal.SIGUSR2)
                    for _ in range(100):
                        await asyncio.sleep(0.1)
                        if out.exists() and out.stat().st_size:
                            await asyncio.sleep(0.2)  # the dump is one write; let it end
                            break
                finally:
                    wire.close()
                if keep is not None:  # for reading with pstats (--profile-to)
                    shutil.copy(out, keep.with_name(f"{keep.name}.{route}"))
                stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
                figures[f"{route}Calls"] = answered
                figures[route] = sum(entry[1] for entry in stats.values()) / answered
                # each asks for the running loop in C, which on Python 3.11 checks the
                # process id: a getpid system call every time
                figures[f"{route}LoopAsks"] = sum(
                    entry[1] for (_f, _l, name), entry in stats.items()
                    if "get_running_loop" in name) / answered
                shares = _by_package(stats)
                passes = json.loads(Path(f"{out}.gc").read_text())
                figures[f"{route}Collections"] = 1000 * sum(passes) / answered
                who = "one client" if clients == 1 else f"{clients} clients"
                print(f"{route} route, {who}, {answered} calls: "
                      f"{figures[route]:.0f} Python calls per call in the gateway; by "
                      "package (a C function counted with its caller's): " + ", ".join(
                          f"{name} {count / answered:.0f}" for name, count in shares[:8]))
                print(f"{route} route, Python calls per call by part of the call: " + ", ".join(
                    f"{name} {count / answered:.0f}" for name, count in _by_part(stats)))
                print(f"{route} route: the cycle collector's passes per 1,000 calls by "
                      "generation: " + " / ".join(f"{1000 * n / answered:.1f}" for n in passes))
                print(f"{route} route: asyncio.get_running_loop (a getpid system call each "
                      f"on Python 3.11) {figures[f'{route}LoopAsks']:.1f} times per call")
    return figures


def _by_package(stats: dict[tuple[str, int, str], tuple[Any, ...]]) -> list[tuple[str, int]]:
    """Calls per package (``kubemoot.gateway``, ``kubemoot.runtime``, ``uvicorn``, ``stdlib``,
    …), most first; a C function's calls go to the package of the Python that called it."""
    def package(filename: str) -> str:
        if "/kubemoot/" in filename:
            parts = filename.rsplit("/kubemoot/", 1)[1].split("/")
            return "kubemoot." + (parts[0] if len(parts) > 1 else parts[0].removesuffix(".py"))
        if "site-packages/" in filename:
            return filename.rsplit("site-packages/", 1)[1].split("/")[0]
        return "stdlib"

    counts: dict[str, int] = {}
    for (filename, _line, _name), entry in stats.items():
        if filename == "~":  # a C function: counted where it was called from
            for (caller, _l, _n), by_caller in entry[4].items():
                counts[package(caller)] = counts.get(package(caller), 0) + by_caller[1]
        else:
            counts[package(filename)] = counts.get(package(filename), 0) + entry[1]
    return sorted(counts.items(), key=lambda item: -item[1])


#: The parts of a gateway call, by the files that do them (the first that matches).
_PARTS = (
    ("placement", ("runtime/planner", "runtime/view", "runtime/snapshot", "runtime/options",
                   "runtime/filters", "runtime/cost", "runtime/placement", "runtime/conditions",
                   "runtime/prefix", "runtime/capacity", "runtime/waiting", "runtime/occupancy",
                   "runtime/eviction", "runtime/latency", "runtime/circuit", "runtime/budget",
                   "runtime/held_plans", "runtime/watching")),
    ("tickets", ("runtime/tickets", "runtime/ticket_", "runtime/claims", "runtime/lease",
                 "runtime/demand", "/pydantic/")),
    ("store", ("/kubemoot/store/",)),
    ("call service and record", ("runtime/calls", "runtime/record", "runtime/tokens",
                                 "runtime/refusals", "/kubemoot/dashboard/")),
    ("HTTP server", ("/uvicorn/", "/kubemoot/serving", "/starlette/")),
    ("handler", ("gateway/app", "gateway/requests", "gateway/openai", "gateway/catalogue",
                 "gateway/errors")),
    ("engine client", ("gateway/calls", "gateway/upstream", "gateway/jsoncodec")),
    ("access log and guards", ("gateway/access", "gateway/guard", "gateway/health",
                               "gateway/server", "gateway/keys", "/prometheus_client/")),
)


def _by_part(stats: dict[tuple[str, int, str], tuple[Any, ...]]) -> list[tuple[str, int]]:
    """Calls per part of a gateway call (:data:`_PARTS`: placement; the ticket's claim,
    lease, release and the model's recent use; the store; the call service with the
    decision summary and the call log; the HTTP server; the route's handler; the engine
    client with the answer's parsing; the access log, guards and metrics), most first;
    a C function's calls go to the part that called it, the rest (asyncio, the clock)
    to ``other``."""
    def part(filename: str) -> str:
        return next((name for name, marks in _PARTS if any(m in filename for m in marks)),
                    "other")

    counts: dict[str, int] = {}
    for (filename, _line, _name), entry in stats.items():
        if filename == "~":
            for (caller, _l, _n), by_caller in entry[4].items():
                counts[part(caller)] = counts.get(part(caller), 0) + by_caller[1]
        else:
            counts[part(filename)] = counts.get(part(filename), 0) + entry[1]
    return sorted(counts.items(), key=lambda item: -item[1])


def find_litellm(given: str | None) -> str | None:
    """The LiteLLM proxy's command: --litellm, else beside this Python, else on PATH."""
    if given:
        return given
    beside = Path(sys.executable).parent / "litellm"
    return str(beside) if beside.exists() else shutil.which("litellm")


@contextmanager
def litellm_proxy(command: str, upstream: str, port: int) -> Iterator[str]:
    """LiteLLM's proxy in front of the emulator, offline and without a master key.

    ``upstream`` is its model string: ``openai/qwen3:8b`` with the emulator's ``/v1`` as
    api_base (the OpenAI route), or ``ollama_chat/qwen3:8b`` with the emulator's root
    (LiteLLM speaks Ollama's /api/chat to it; its clients still speak OpenAI).
    """
    model, api_base = upstream.split(" ", 1)
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
           "OPENAI_API_KEY": "unused", "LITELLM_LOG": "ERROR"}
    # A config file, not --model: recent proxies answer every call made through a
    # --model-only start with a 500 ("'NoneType' object has no attribute 'acompletion'").
    config = Path(tempfile.mkdtemp(prefix="litellm-")) / "config.yaml"
    config.write_text(json.dumps({"model_list": [{
        "model_name": MODEL,
        "litellm_params": {"model": model, "api_base": api_base, "api_key": "unused"},
    }]}))  # JSON is YAML
    process = subprocess.Popen(
        [command, "--config", str(config), "--host", "127.0.0.1",
         "--port", str(port), "--num_workers", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, process, "/health/liveliness", seconds=180)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(config.parent, ignore_errors=True)


def gateway(providers: list[str], port: int, *extra: str) -> list[str]:
    flags = [a for p in providers for a in ("--provider", p)]
    return ["gateway", *flags, *extra, "--wait-limit", "30s",
            "--listen", f"127.0.0.1:{port}"]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


ROUTES = {
    "ollama": ("/api/chat", BODY),
    "openai": ("/v1/chat/completions", {"model": MODEL, "messages": BODY["messages"]}),
}


async def latency(
    direct: str, through: str, calls: int, route: str = "ollama", *, label: str = "gateway",
    through_route: str | None = None,
) -> tuple[float, float]:
    """Added p50 and p99 (ms) of ``through`` over ``direct`` on one route, sampled in turns.

    ``through_route`` is the route the front speaks when it differs from the engine's (a
    proxy that speaks only the OpenAI API in front of an Ollama engine).
    """
    path, body = ROUTES[route]
    front_path, front_body = ROUTES[through_route or route]
    requests = {direct: request_bytes(direct, path, body),
                through: request_bytes(through, front_path, front_body)}
    samples: dict[str, list[float]] = {direct: [], through: []}
    wires = {url: await Wire.open(url) for url in requests}
    try:
        for _ in range(20):  # warm both paths (model loaded, connections open)
            for url, request in requests.items():
                _answered(url, await wires[url].call(request))
        for _ in range(calls):
            for url, request in requests.items():
                began = time.perf_counter()
                status = await wires[url].call(request)
                samples[url].append((time.perf_counter() - began) * 1000)
                _answered(url, status)
    finally:
        for wire in wires.values():
            wire.close()
    d, g = samples[direct], samples[through]
    print(f"{route} route, one client, {calls} calls each: direct p50 {pct(d, .5):.2f} ms "
          f"p99 {pct(d, .99):.2f} ms; {label} p50 {pct(g, .5):.2f} ms "
          f"p95 {pct(g, .95):.2f} ms p99 {pct(g, .99):.2f} ms")
    return pct(g, .5) - pct(d, .5), pct(g, .99) - pct(d, .99)


def cpu_seconds(pid: int) -> float | None:
    """A process's CPU time so far (user + system), or None where /proc does not tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """A process's user and system CPU seconds so far, apart."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def cpu_apart(seconds: float, clients: int) -> dict[str, float]:
    """The gateway's user and system CPU milliseconds per answered call, apart, with
    ``clients`` clients posting for ``seconds`` per route (no direct run, no latency
    run): the system part is where a change in system calls shows, which callgrind and
    cProfile do not count. Probes are an hour apart, so none lands among the calls."""
    emulator_port, gateway_port = free_port(), free_port()
    card = "vramMiB=24576,numParallel=32,contextLength=4096"
    fast = [sys.executable, "-c", _FAST_EMULATOR, "24576", "32", str(emulator_port)]
    front = gateway([f"gpu=http://127.0.0.1:{emulator_port},{card}"], gateway_port,
                    "--probe-interval", "1h")
    figures: dict[str, float] = {}
    with servers(fast, front) as (_direct, through):
        pid = PIDS[through]
        for route, (path, body) in ROUTES.items():
            await Wires(through, path, body, clients).drive(1.0)  # warm
            wires = Wires(through, path, body, clients)
            user, system = cpu_split(pid)
            await wires.drive(seconds)
            user_after, system_after = cpu_split(pid)
            answered = max(1, wires.answered)
            figures[f"{route}User"] = 1000 * (user_after - user) / answered
            figures[f"{route}System"] = 1000 * (system_after - system) / answered
            print(f"{route} route, {clients} clients, {wires.answered} calls: gateway CPU "
                  f"per call {figures[f'{route}User']:.3f} ms user, "
                  f"{figures[f'{route}System']:.3f} ms system")
    return figures


async def throughput(url: str, seconds: float, clients: int, route: str = "ollama") -> float:
    return (await measured_throughput(url, seconds, clients, route))[0]


#: CPU milliseconds per answered call of the load generator (this process), by URL.
CLIENT_CPU_MS: dict[str, float] = {}


async def measured_throughput(url: str, seconds: float, clients: int,
                              route: str = "ollama") -> tuple[float, float | None]:
    """Requests per second, and the CPU milliseconds per answered call of the process
    serving ``url`` (None when unknown); the clients' own go to ``CLIENT_CPU_MS``."""
    pid = PIDS.get(url)
    before, ours = (cpu_seconds(pid) if pid else None), time.process_time()
    rate, done = await _drive(url, seconds, clients, route)
    after, ours = (cpu_seconds(pid) if pid else None), time.process_time() - ours
    if done:
        CLIENT_CPU_MS[url] = 1000 * ours / done
    if before is None or after is None or not done:
        return rate, None
    return rate, 1000 * (after - before) / done


async def _drive(url: str, seconds: float, clients: int, route: str) -> tuple[float, int]:
    path, body = ROUTES[route]
    wires = Wires(url, path, body, clients)
    rate = await wires.drive(seconds)
    if wires.refused:
        print(f"{url}: refusals by status {wires.refused}")
    return rate, wires.answered


class CallFailed(SystemExit):
    """A latency call was not answered 200: the figures would mean nothing."""


def _answered(url: str, status: int) -> None:
    if status != 200:
        raise CallFailed(f"{url}: a latency call was answered {status}")


async def overcommits(requests: int) -> int:
    nats = NatsServer()
    await nats.start()
    try:
        ports = [free_port() for _ in range(4)]
        card = "vramMiB=12288,numParallel=2,contextLength=4096"
        emulators = [emulator(p, vram=12288, parallel=2, time_scale=0.01) for p in ports[:2]]
        providers = [f"gpu-{i}=http://127.0.0.1:{p},{card}" for i, p in enumerate(ports[:2])]
        replicas = [gateway(providers, p, "--nats", nats.url) for p in ports[2:]]
        with servers(*emulators, *replicas) as urls:
            engines, fronts = urls[:2], urls[2:]
            models = ("qwen3:8b", "qwen3:14b", "qwen3:8b", "qwen3:14b", "qwen3:32b")
            async with httpx.AsyncClient(timeout=600,
                                         limits=httpx.Limits(max_connections=500)) as http:
                async def one(i: int) -> int:
                    body: dict[str, object] = {**BODY, "model": models[i % len(models)]}
                    if i % 3 == 0:  # a client that asks the engine to unload soon
                        body["keep_alive"] = "1s"
                    answer = await http.post(fronts[i % 2] + "/api/chat", json=body)
                    return answer.status_code

                statuses = await asyncio.gather(*(one(i) for i in range(requests)))
                stats = [(await http.get(e + "/emulator/stats")).json() for e in engines]
        evicted = sum(s["evictions"] for s in stats)
        over = sum(1 for s in stats if s["peakVramMiB"] > s["vramMiB"])
        answered = sum(1 for s in statuses if s == 200)
        refusals = {s: statuses.count(s) for s in sorted(set(statuses)) if s != 200}
        print(f"two replicas on NATS, {requests} calls: {answered} answered, "
              f"refusals by status {refusals} (qwen3:32b is larger than these cards: 400); "
              f"engine evictions {evicted}, "
              f"cards over their memory {over}, loads "
              f"{sum(s['loads'] for s in stats)}")
        for url, s in zip(engines, stats, strict=True):
            if s["evictions"] or s["peakVramMiB"] > s["vramMiB"]:
                # what a failing run needs to be understood later: which card, which models
                print(f"  {url}: evicted {s['evictionsByModel']}, peak {s['peakVramMiB']} of "
                      f"{s['vramMiB']} MiB, loads {s['loadsByModel']}")
        return evicted + over
    finally:
        await nats.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--litellm", default=None,
                        help="LiteLLM's proxy command (default: beside this Python or on PATH; "
                             "install it in its own venv: pip install 'litellm[proxy]'); "
                             "'off' skips it")
    parser.add_argument("--litellm-calls", type=int, default=500,
                        help="calls per route for LiteLLM's latency (it is ~10x slower)")
    parser.add_argument("--count-calls", type=int, default=0, metavar="N",
                        help="only count the gateway's Python calls per call over N calls "
                             "per route (cProfile; deterministic), and print those keys")
    parser.add_argument("--count-clients", type=int, default=1, metavar="C",
                        help="with --count-calls: C clients at once for --seconds per route "
                             "instead of N calls in a row (the calls answered are counted)")
    parser.add_argument("--profile-to", type=Path, default=None, metavar="PATH",
                        help="with --count-calls: keep each route's cProfile stats as "
                             "PATH.ollama and PATH.openai (read them with pstats)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="only measure the gateway's user and system CPU per call, "
                             "apart, over --seconds per route with --clients clients, "
                             "and print those keys")
    args = parser.parse_args()
    if args.cpu_only:
        cpu = await cpu_apart(args.seconds, args.clients)
        print(json.dumps({"gatewayUserMsPerCall": round(cpu["ollamaUser"], 3),
                          "gatewaySystemMsPerCall": round(cpu["ollamaSystem"], 3),
                          "gatewayUserMsPerCallOpenAI": round(cpu["openaiUser"], 3),
                          "gatewaySystemMsPerCallOpenAI": round(cpu["openaiSystem"], 3),
                          "clients": args.clients, "seconds": args.seconds}))
        return
    if args.count_calls:
        counted = await python_calls(args.count_calls, args.profile_to,
                                     clients=args.count_clients, seconds=args.seconds)
        print(json.dumps({"pythonCallsPerCall": round(counted["ollama"], 1),
                          "pythonCallsPerCallOpenAI": round(counted["openai"], 1),
                          "collectionsPer1000Calls": round(counted["ollamaCollections"], 1),
                          "collectionsPer1000CallsOpenAI":
                              round(counted["openaiCollections"], 1),
                          "loopAsksPerCall": round(counted["ollamaLoopAsks"], 1),
                          "loopAsksPerCallOpenAI": round(counted["openaiLoopAsks"], 1),
                          "calls": counted["ollamaCalls"], "callsOpenAI": counted["openaiCalls"],
                          "clients": args.count_clients}))
        return
    began = time.monotonic()
    emulator_port, gateway_port = free_port(), free_port()
    card = "vramMiB=24576,numParallel=32,contextLength=4096"
    fast = [sys.executable, "-c", _FAST_EMULATOR, "24576", "32", str(emulator_port)]
    ours: dict[str, dict[str, float]] = {}
    with servers(fast,
                 gateway([f"gpu={f'http://127.0.0.1:{emulator_port}'},{card}"],
                         gateway_port)) as (direct, through):
        for route in ROUTES:
            p50, p99 = await latency(direct, through, args.calls, route)
            direct_rps, engine_cpu = await measured_throughput(direct, args.seconds,
                                                               args.clients, route)
            gateway_rps, gateway_cpu = await measured_throughput(through, args.seconds,
                                                                 args.clients, route)
            ours[route] = {"addedP50Ms": p50, "addedP99Ms": p99, "directRps": direct_rps,
                           "gatewayRps": gateway_rps,
                           "throughputRatio": gateway_rps / direct_rps if direct_rps else 0.0,
                           "gatewayCpuMs": gateway_cpu or 0.0, "engineCpuMs": engine_cpu or 0.0,
                           "generatorCpuMs": CLIENT_CPU_MS.get(through, 0.0)}
            print(f"{route} route, {args.clients} clients: direct {direct_rps:.0f} req/s, "
                  f"gateway {gateway_rps:.0f} req/s (ratio {ours[route]['throughputRatio']:.2f}); "
                  f"CPU per call: gateway {gateway_cpu or 0:.2f} ms, "
                  f"engine {engine_cpu or 0:.2f} ms, clients {CLIENT_CPU_MS.get(direct, 0):.2f} "
                  f"ms direct and {CLIENT_CPU_MS.get(through, 0):.2f} ms through the gateway")
        theirs = await versus_litellm(args, direct, emulator_port)
    print(f"({time.monotonic() - began:.1f} s so far)")
    over = await overcommits(args.requests)
    print(f"({time.monotonic() - began:.1f} s in all)")
    api, v1 = ours["ollama"], ours["openai"]
    figures: dict[str, object] = {
        "addedP50Ms": round(api["addedP50Ms"], 3), "addedP99Ms": round(api["addedP99Ms"], 3),
        "throughputRatio": round(api["throughputRatio"], 3),
        "addedP50MsOpenAI": round(v1["addedP50Ms"], 3),
        "addedP99MsOpenAI": round(v1["addedP99Ms"], 3),
        "throughputRatioOpenAI": round(v1["throughputRatio"], 3),
        "gatewayCpuMsPerCall": round(api["gatewayCpuMs"], 3),
        "gatewayCpuMsPerCallOpenAI": round(v1["gatewayCpuMs"], 3),
        "engineCpuMsPerCall": round(api["engineCpuMs"], 3),
        "generatorCpuMsPerCall": round(api["generatorCpuMs"], 3),
        "generatorCpuMsPerCallOpenAI": round(v1["generatorCpuMs"], 3),
        "overcommits": over,
        "directRps": round(api["directRps"], 1), "gatewayRps": round(api["gatewayRps"], 1),
        "clients": args.clients, "calls": args.calls,
    }
    if theirs:
        # Ours over theirs on each route; the headline keys take the worse route.
        p50_vs = {r: ours[r]["addedP50Ms"] / max(t["addedP50Ms"], 1e-9) for r, t in theirs.items()}
        rps_vs = {r: ours[r]["gatewayRps"] / max(t["gatewayRps"], 1e-9) for r, t in theirs.items()}
        figures["addedP50MsVsLiteLLM"] = round(max(p50_vs.values()), 3)
        figures["throughputVsLiteLLM"] = round(min(rps_vs.values()), 3)
        figures["liteLLM"] = {r: {k: round(v, 3) for k, v in t.items()} for r, t in theirs.items()}
    print(json.dumps(figures))


async def versus_litellm(
    args: argparse.Namespace, direct: str, emulator_port: int
) -> dict[str, dict[str, float]]:
    """LiteLLM's proxy in front of the same emulator, on each route; {} when not installed."""
    command = None if args.litellm == "off" else find_litellm(args.litellm)
    if command is None:
        print("LiteLLM: not found (install 'litellm[proxy]' in a venv of its own and pass "
              "--litellm PATH), comparison skipped")
        return {}
    engine = f"http://127.0.0.1:{emulator_port}"
    upstreams = {"openai": f"openai/{MODEL} {engine}/v1", "ollama": f"ollama_chat/{MODEL} {engine}"}
    theirs: dict[str, dict[str, float]] = {}
    for route, upstream in upstreams.items():
        with litellm_proxy(command, upstream, free_port()) as proxy:
            # LiteLLM serves only the OpenAI API: its clients speak /v1 on both routes, and
            # the direct figure is the engine's own route.
            try:
                p50, p99 = await latency(direct, proxy, args.litellm_calls, route,
                                         label="LiteLLM", through_route="openai")
            except CallFailed as failed:
                # a broken LiteLLM install must not cost the run its own figures
                print(f"LiteLLM ({command}): {failed}; comparison skipped")
                return {}
            rps = await throughput(proxy, args.seconds, args.clients, "openai")
        theirs[route] = {"addedP50Ms": p50, "addedP99Ms": p99, "gatewayRps": rps}
        print(f"{route} route, {args.clients} clients: LiteLLM {rps:.0f} req/s")
    return theirs


if __name__ == "__main__":
    run(main())
