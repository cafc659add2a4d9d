"""What the gateway adds to a call, and whether replicas overcommit a card.

* **Added latency**: one client, a warm model, an emulator with no emulated delay
  (``--time-scale 0``): ``/api/chat`` straight to the emulator and through the gateway,
  sampled in turns so load from elsewhere weighs on both alike; the figures are the
  gateway's p50 and p99 minus the direct ones (goals: ≤ 2 ms and ≤ 10 ms).
* **Throughput**: requests per second at 32 concurrent clients, through the gateway
  and direct (goal: ratio ≥ 0.5).
* **Overcommits**: two gateway replicas sharing a real nats-server in front of two
  small emulated cards, many concurrent calls over three models; the engines'
  ``/emulator/stats`` count every model they had to evict on their own (goal: 0).

Every server is its own process (``kubemoot emulate-ollama``, ``kubemoot gateway``), as in a
deployment. Human-readable lines first; the last line is one JSON object:
``{"addedP50Ms": …, "addedP99Ms": …, "throughputRatio": …, "overcommits": …}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kubemoot.testing.nats_server import NatsServer, free_port  # noqa: E402

KUBEMOOT = [sys.executable, "-c", "from kubemoot.cli import main; main()"]
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
        yield urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def _wait_up(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{url}: the server exited with {process.returncode}")
        try:
            if httpx.get(url + "/", timeout=1).status_code == 200:
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
# baseline is the engine and not that artefact.
_FAST_EMULATOR = """
import sys, uvicorn
from kubemoot.emulation.server import EmulatorConfig, OllamaEmulator
config = EmulatorConfig(vram_mib=int(sys.argv[1]), num_parallel=int(sys.argv[2]),
                        context_length=4096, time_scale=0.0)
uvicorn.run(OllamaEmulator(config).app, host="127.0.0.1", port=int(sys.argv[3]),
            log_level="error", lifespan="off", access_log=False)
"""


def gateway(providers: list[str], port: int, *extra: str) -> list[str]:
    flags = [a for p in providers for a in ("--provider", p)]
    return ["gateway", *flags, *extra, "--wait-limit", "30s",
            "--listen", f"127.0.0.1:{port}"]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(direct: str, through: str, calls: int) -> tuple[float, float]:
    samples: dict[str, list[float]] = {direct: [], through: []}
    async with httpx.AsyncClient(timeout=60) as http:
        for _ in range(20):  # warm both paths (model loaded, connections open)
            for url in samples:
                (await http.post(url + "/api/chat", json=BODY)).raise_for_status()
        for _ in range(calls):
            for url in samples:
                began = time.perf_counter()
                (await http.post(url + "/api/chat", json=BODY)).raise_for_status()
                samples[url].append((time.perf_counter() - began) * 1000)
    d, g = samples[direct], samples[through]
    print(f"one client, {calls} calls each: direct p50 {pct(d, .5):.2f} ms "
          f"p99 {pct(d, .99):.2f} ms; gateway p50 {pct(g, .5):.2f} ms "
          f"p99 {pct(g, .99):.2f} ms")
    return pct(g, .5) - pct(d, .5), pct(g, .99) - pct(d, .99)


async def throughput(url: str, seconds: float, clients: int) -> float:
    done = 0
    refused: dict[int, int] = {}
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                answer = await http.post(url + "/api/chat", json=BODY)
                if answer.status_code == 200:
                    done += 1  # only answers count; a refusal is no throughput
                else:
                    refused[answer.status_code] = refused.get(answer.status_code, 0) + 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        if refused:
            print(f"{url}: refusals by status {refused}")
        return done / (time.perf_counter() - began)


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
                    body = {**BODY, "model": models[i % len(models)]}
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
        return evicted + over
    finally:
        await nats.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    began = time.monotonic()
    emulator_port, gateway_port = free_port(), free_port()
    card = "vramMiB=24576,numParallel=32,contextLength=4096"
    fast = [sys.executable, "-c", _FAST_EMULATOR, "24576", "32", str(emulator_port)]
    with servers(fast,
                 gateway([f"gpu={f'http://127.0.0.1:{emulator_port}'},{card}"],
                         gateway_port)) as (direct, through):
        added_p50, added_p99 = await latency(direct, through, args.calls)
        direct_rps = await throughput(direct, args.seconds, args.clients)
        gateway_rps = await throughput(through, args.seconds, args.clients)
    ratio = gateway_rps / direct_rps if direct_rps else 0.0
    print(f"{args.clients} clients: direct {direct_rps:.0f} req/s, gateway "
          f"{gateway_rps:.0f} req/s (ratio {ratio:.2f})")
    print(f"({time.monotonic() - began:.1f} s so far)")
    over = await overcommits(args.requests)
    print(f"({time.monotonic() - began:.1f} s in all)")
    print(json.dumps({"addedP50Ms": round(added_p50, 3), "addedP99Ms": round(added_p99, 3),
                      "throughputRatio": round(ratio, 3), "overcommits": over,
                      "directRps": round(direct_rps, 1), "gatewayRps": round(gateway_rps, 1),
                      "clients": args.clients, "calls": args.calls}))


if __name__ == "__main__":
    asyncio.run(main())
