"""The demo application: the whole system in one process, on emulated GPUs.

It starts one Ollama-API **emulator** per ModelProvider of the bundle (by default the
homelab bundle shipped inside the package, also at ``examples/homelab`` in the
repository: a 32 GiB and a 24 GiB card), runs the control plane over the bundle,
probes the emulators into the shared store (the embedded store, or NATS), and runs
several discussions at once through the per-call runtime. Every call is attributed to
the provider it really ran on; the emulators' own books (requests received, loads,
peak VRAM) go into the report beside the runtime's, so the two can be checked against
each other. The emulators run faster than real time (``time_scale``), and the
runtime's cost settings are scaled to match, so every cost stays in real seconds.

Everything the run starts is registered with a :class:`kubemoot.process.Lifecycle`,
which stops it in the one safe order (tasks, runtime, stragglers, clients, emulators,
store). ``kubemoot demo`` (:mod:`kubemoot.cli.demo`) holds the options and the printing;
what a person sees while it runs comes through a :class:`DemoView`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from kubemoot.api.errors import InputError
from kubemoot.process import Lifecycle, Stage

if TYPE_CHECKING:
    from kubemoot.agent.discussion import DiscussionResult
    from kubemoot.agent.signals import Signal
    from kubemoot.clock import Clock
    from kubemoot.dashboard import DashboardServer
    from kubemoot.emulation.server import OllamaEmulator
    from kubemoot.providers.factory import ProviderClients
    from kubemoot.providers.ollama import OllamaProvider
    from kubemoot.settings import DashboardSettings, Settings
    from kubemoot.store.health import StoreHealth
    from kubemoot.store.protocol import KV

__all__ = [
    "Books",
    "DemoView",
    "InferenceStarts",
    "PageOptions",
    "default_bundle",
    "demo_report",
    "emulated_inference_seconds",
    "run_demo",
]

# The default bundle is package data, so the demo runs from any directory after any
# kind of install; the repository's examples/homelab is a link to the same files.
DEFAULT_BUNDLE_PARTS = ("examples", "homelab")
# Emulated seconds per call: a fixed part plus a part per generated token (8–31 tokens).
CALL_BASE_SECONDS = 2.0
CALL_PER_TOKEN_SECONDS = 0.3
CALL_PER_PROMPT_TOKEN_SECONDS = 0.0
PROBE_INTERVAL_SECONDS = 0.25
SAMPLE_INTERVAL_SECONDS = 0.01


class DemoView(Protocol):
    """What a person sees while the demo runs (the CLI prints; a test may record)."""

    async def follow(self, discussing: asyncio.Task[Any], books: Books, agents: Any,
                     total: int) -> None:
        """Show progress until ``discussing`` ends (the run awaits it afterwards)."""

    def store_health_changed(self, health: StoreHealth, where: str) -> None:
        """The shared store stopped answering, or answers again."""

    def dashboard_started(self, url: str) -> None: ...

    def dashboard_lingers(self, url: str, seconds: float | None) -> None:
        """The demo is done; the page stays up ``seconds`` (None: until stopped)."""


@contextlib.contextmanager
def default_bundle() -> Iterator[Path]:
    """The homelab bundle shipped inside the package, as a directory on disk.

    An installed package is a directory on disk, which ``as_file`` hands out as it is;
    the context keeps the door open for a package that would need a temporary copy.
    """
    from importlib.resources import as_file, files

    resource = files("kubemoot").joinpath(*DEFAULT_BUNDLE_PARTS)
    with as_file(resource) as path:
        yield Path(path)


# -- the run ---------------------------------------------------------------------------


class Books:
    """Signals and emulator samples gathered while the demo runs."""

    def __init__(self) -> None:
        self.signals: list[Signal] = []
        self.peak: dict[str, int] = {}
        self.over: Counter[str] = Counter()
        self._above: set[str] = set()

    def sample(self, name: str, used: int, usable: int) -> None:
        self.peak[name] = max(self.peak.get(name, 0), used)
        if used > usable and name not in self._above:
            self.over[name] += 1  # one overcommit per excursion above the budget
            self._above.add(name)
        elif used <= usable:
            self._above.discard(name)


async def run_demo(path: Path, *, open_store: Callable[[Clock], Awaitable[KV]],
                   store: str, discussions: int, seed: int, time_scale: float,
                   dashboard: PageOptions | None, view: DemoView,
                   tunables: Settings, where: str = "") -> dict[str, Any]:
    """Run the demo over the bundle at ``path`` and return its report (see the module
    docstring). ``open_store`` opens the shared store (``store`` says which: "memory"
    or "nats"); ``view`` shows progress and tells what a person should know, ``where``
    names the NATS servers (masked) for those messages."""
    from datetime import UTC, datetime

    from kubemoot.agent.crew import COORDINATOR_ROLE, profiles_from_schedule
    from kubemoot.agent.demo import demo_tools, run_discussions
    from kubemoot.agent.discussion import Coordinator
    from kubemoot.agent.pool import CallSettings
    from kubemoot.agent.signals import CallbackSink
    from kubemoot.agent.wiring import build_stack
    from kubemoot.api.loader import load_bundle
    from kubemoot.clock import SystemClock
    from kubemoot.dashboard.calllog import CallLogWriter
    from kubemoot.providers.factory import ProviderClients
    from kubemoot.providers.prober import Prober, publish_to_kv
    from kubemoot.scheduling import schedule_bundle
    from kubemoot.store.documents import PROVIDER_STATE_BUCKET
    from kubemoot.store.health import StoreHealth

    started = time.monotonic()
    resources = load_bundle([path])
    if not resources.providers:
        raise InputError("the bundle has no ModelProvider to emulate", file=str(path))
    result = schedule_bundle(resources, now=datetime.now(UTC))
    clock = SystemClock()
    # every client of this process comes from here, with the timeouts the command read
    factory = ProviderClients.of(tunables.runtime, clock=clock)
    books = Books()
    process = Lifecycle(straggler_grace=tunables.process.straggler_grace_seconds)
    emulators: dict[str, OllamaEmulator] = {}
    clients: dict[str, OllamaProvider] = {}
    try:
        process.on_stop(Stage.EMULATORS, lambda: _stop_emulators(emulators),
                        name="emulators")
        await _start_emulators(resources, time_scale, into=emulators)
        kv = await open_store(clock)
        process.on_stop(Stage.STORE, kv.close, name="store")
        for p in resources.providers:
            client = clients[p.metadata.name] = _counting_provider(
                p, emulators[p.metadata.name].url, factory)
            process.on_stop(Stage.CLIENTS, client.close, name=f"client {client.name}")
        states = await kv.bucket(PROVIDER_STATE_BUCKET)
        prober = Prober(list(clients.values()), clock=clock, publish=publish_to_kv(states))
        if store == "nats":
            health = StoreHealth(states, clock=clock, every=tunables.process.store_check_seconds)

            async def tell(health: StoreHealth) -> None:
                view.store_health_changed(health, where)

            health.on_change(tell)
            process.add_task(asyncio.create_task(health.run()))
        await prober.probe_all()

        async def after_call(provider: str) -> None:
            await prober.probe_one(clients[provider])

        starts = InferenceStarts(factory, time_scale)

        def chat_client(provider: str, endpoint: str, settings: CallSettings) -> OllamaProvider:
            return starts.client(provider, endpoint, timeout=settings.timeout)

        # The emulators run time_scale real seconds per emulated second; the runtime's
        # times (as set in KUBEMOOT_*, else the defaults) are scaled alike.
        read = tunables.runtime
        settings = read.with_values({
            "load_rate_mibps": read.load_rate_mibps / time_scale,
            "unload_seconds": read.unload_seconds * time_scale,
            "default_latency_seconds": read.default_latency_seconds * time_scale,
            "gpu_wait_limit_seconds": read.gpu_wait_limit_seconds * time_scale,
        })
        declared = {m.spec.model: m.spec.vram_mib for m in resources.models
                    if m.spec.vram_mib is not None}
        stack = await build_stack(
            kv, clients=clients, client_factory=chat_client, clock=clock, settings=settings,
            declared=declared, after_call=after_call)
        process.on_stop(Stage.RUNTIME, stack.close, name="runtime stack")
        process.add_task(asyncio.create_task(prober.run(PROBE_INTERVAL_SECONDS)))
        process.add_task(asyncio.create_task(_sample(emulators, resources, books)))
        # Every finished call goes to the call log, so any dashboard on this store
        # (in this process with --dashboard, or `kubemoot dashboard --nats`) shows it.
        calllog = await CallLogWriter.open(kv)
        grace = tunables.process.straggler_grace_seconds
        process.on_stop(Stage.RUNTIME, lambda: asyncio.wait_for(calllog.flush(), grace),
                        name="call log")
        stack.agents.on_record(calllog.record)
        stack.agents.on_record(starts.attach)
        page = None
        if dashboard is not None:
            page = await _start_dashboard(kv, clock, dashboard.port, tunables.dashboard)
            process.on_stop(Stage.RUNTIME, page.stop, name="dashboard")
            view.dashboard_started(page.url)
        endpoints = {name: emulator.url for name, emulator in emulators.items()}
        profiles = profiles_from_schedule(result, resources.providers, endpoints=endpoints,
                                          tools=demo_tools())
        coordinator_profile = next((p for p in profiles if p.role == COORDINATOR_ROLE), None)
        members = [p for p in profiles if p.role != COORDINATOR_ROLE]
        if coordinator_profile is None or not members:
            raise InputError("the bundle needs a coordinator Agent and at least one member "
                             "with a mulling binding", file=str(path))
        sink = CallbackSink(books.signals.append)
        coordinator = Coordinator(stack.agents, coordinator_profile, sink=sink,
                                  deadline_seconds=settings.gpu_wait_limit_seconds)
        discussing = asyncio.create_task(run_discussions(
            coordinator, members, count=discussions, seed=seed,
            stagger_seconds=40.0 * time_scale))
        process.add_task(discussing, first=True)
        await view.follow(discussing, books, stack.agents, discussions)
        threads = await discussing
        report = demo_report(threads, stack.agents.records, starts, books, emulators,
                             clients, resources, store=store,
                             seed=seed, time_scale=time_scale,
                             wall=time.monotonic() - started)
        await calllog.flush()
        if page is not None and dashboard is not None:
            dashboard.present(report)
            view.dashboard_lingers(page.url, dashboard.linger)
            await _linger(page, dashboard.linger)
        return report
    finally:
        await process.shutdown()


async def _start_emulators(resources: Any, time_scale: float, *,
                           into: dict[str, OllamaEmulator]) -> None:
    """One emulator per ModelProvider, registered in ``into`` before it starts, so an
    interrupted start still stops every one that came up."""
    from kubemoot.emulation.server import EmulatedModel, EmulatorConfig, OllamaEmulator

    # The emulated footprint of each model is its declared vramMib, so the control
    # plane, the runtime and the engines agree on every size.
    catalogue = {m.spec.model: EmulatedModel(m.spec.model, m.spec.vram_mib or 4096,
                                             family=m.metadata.labels.get("family", "x"))
                 for m in resources.models}
    for provider in resources.providers:
        capacity = provider.capacity
        vram = capacity.vram_total_mib if capacity and capacity.vram_total_mib else 24576
        config = EmulatorConfig(
            models=tuple(catalogue.values()), vram_mib=vram,
            reserve_mib=provider.spec.reserve_mib,  # the engine keeps what the runtime does
            num_parallel=provider.spec.num_parallel or 1,
            context_length=provider.spec.context_length or 4096,
            base_latency_s=CALL_BASE_SECONDS, per_token_s=CALL_PER_TOKEN_SECONDS,
            prompt_per_token_s=CALL_PER_PROMPT_TOKEN_SECONDS,
            time_scale=time_scale,
        )
        into[provider.metadata.name] = OllamaEmulator(config)
    await asyncio.gather(*(asyncio.to_thread(e.start) for e in into.values()))


async def _stop_emulators(emulators: dict[str, OllamaEmulator]) -> None:
    # An interrupted run may leave a request half served; the engine's complaint about
    # it at shutdown is expected, not news.
    if emulators:
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
        await asyncio.gather(*(asyncio.to_thread(e.stop) for e in emulators.values()))


def _counting_provider(provider: Any, url: str, factory: ProviderClients) -> OllamaProvider:
    """The planner's client for a provider; it remembers each model it unloaded."""
    from dataclasses import replace

    from kubemoot.providers.ollama import OllamaProvider

    class Counting(OllamaProvider):
        unloads: list[str]

        async def unload(self, model: str) -> None:
            self.unloads.append(model)
            await super().unload(model)

    capacity = provider.capacity
    client = replace(factory, kind=Counting).client(
        provider.metadata.name, url, context_length=provider.spec.context_length,
        num_parallel=provider.spec.num_parallel or 1, reserve_mib=provider.spec.reserve_mib,
        total_vram_mib=capacity.vram_total_mib if capacity else None,
    )
    assert isinstance(client, Counting)
    client.unloads = []
    return client


async def _sample(emulators: dict[str, OllamaEmulator], resources: Any, books: Books) -> None:
    """Watch each emulator's resident VRAM against the budget the scheduler keeps."""
    usable = {p.metadata.name: (p.capacity.vram_total_mib if p.capacity else 0) or 0
              for p in resources.providers}
    reserve = {p.metadata.name: p.spec.reserve_mib for p in resources.providers}
    while True:
        for name, emulator in emulators.items():
            books.sample(name, emulator.engine.card.used_mib, usable[name] - reserve[name])
        await asyncio.sleep(SAMPLE_INTERVAL_SECONDS)


class InferenceStarts:
    """When each call's engine began its first inference: the demo's ``wait`` ends there.

    ``wait`` means what it means in the simulator: from issuing the call to the start of
    inference, whether the time went to waiting for a GPU, a load, or a slot in the
    engine's line. The engines do not report their line, but the demo set how long each
    reply computes (:func:`emulated_inference_seconds`), so a reply's arrival less that
    time is when the engine started on it. The asyncio task joins the two halves: a
    call's model requests and its record are made by the same task.
    """

    def __init__(self, factory: ProviderClients, time_scale: float) -> None:
        from dataclasses import replace

        from kubemoot.clock import SystemClock
        from kubemoot.providers.ollama import OllamaProvider

        self._clock = factory.clock or SystemClock()
        self._time_scale = time_scale
        self._pending: dict[asyncio.Task[Any], float] = {}
        self._started: dict[int, float] = {}  # id(CallRecord) -> start of inference
        starts = self

        class Timed(OllamaProvider):
            """The chat pool's client: it tells ``starts`` when each reply arrived."""

            async def chat(self, model: str, messages: Any, **options: Any) -> Any:
                reply = await super().chat(model, messages, **options)
                starts._replied(reply.eval_count, reply.prompt_eval_count)
                return reply

        self._clients = replace(factory, kind=Timed)

    def client(self, provider: str, endpoint: str, *, timeout: float | None) -> OllamaProvider:
        """A chat client (``timeout`` None: the deployment's read timeout)."""
        return self._clients.client(provider, endpoint, timeout=timeout)

    def _replied(self, eval_count: int | None, prompt_tokens: int | None) -> None:
        task = asyncio.current_task()
        if task is None or task in self._pending:
            return  # a later turn of a tool loop: the call had started already
        computing = emulated_inference_seconds(eval_count or 0, prompt_tokens or 0)
        self._pending[task] = self._clock.now() - computing * self._time_scale

    def attach(self, record: Any) -> None:
        """Record listener: runs in the task that made the call's requests."""
        task = asyncio.current_task()
        started = self._pending.pop(task, None) if task is not None else None
        if started is not None:
            self._started[id(record)] = started

    def wait(self, record: Any) -> float | None:
        """Seconds from issue to start of inference; None when no reply ever came."""
        started = self._started.get(id(record))
        return None if started is None else max(0.0, started - record.started_at)


def emulated_inference_seconds(eval_count: int, prompt_tokens: int) -> float:
    """How long the demo's emulators compute one reply (the latency they are given)."""
    return (CALL_BASE_SECONDS + CALL_PER_TOKEN_SECONDS * eval_count
            + CALL_PER_PROMPT_TOKEN_SECONDS * prompt_tokens)


class PageOptions(NamedTuple):
    """``--dashboard``: where to serve it, how long to keep it, how to show the report."""

    port: int
    linger: float | None
    present: Callable[[dict[str, Any]], None]


async def _start_dashboard(kv: Any, clock: Any, port: int,
                           settings: DashboardSettings) -> DashboardServer:
    from kubemoot.dashboard import DashboardServer

    page = DashboardServer(kv, port=port, clock=clock, settings=settings)
    try:
        await page.start()
    except OSError as error:
        raise InputError(f"cannot serve the dashboard on port {port}: "
                         f"{error.strerror or error}", field="--dashboard-port") from None
    return page


async def _linger(page: DashboardServer, seconds: float | None) -> None:
    """Keep the page up after the demo so the final placement can be looked at."""
    if seconds is None:
        await page.wait()
    elif seconds > 0:
        await asyncio.sleep(seconds)


# -- the report ------------------------------------------------------------------------


def demo_report(threads: list[DiscussionResult], records: list[Any], starts: InferenceStarts,
                books: Books, emulators: dict[str, OllamaEmulator], clients: dict[str, Any],
                resources: Any,
                *, store: str, seed: int, time_scale: float, wall: float) -> dict[str, Any]:
    """The run's report: every call with where it ran and how long it waited, the
    engines' own books beside the runtime's, the threads' answers."""
    stand_asides = Counter(s.metadata.reason or "unknown" for t in threads
                           for s in t.stand_asides())
    failures = Counter(s.metadata.failure_type or "unknown" for t in threads
                       for s in t.signals if s.type.value == "failure")
    providers: dict[str, Any] = {}
    engine_evictions = 0
    for p in resources.providers:
        name = p.metadata.name
        engine = emulators[name].engine
        engine_evictions += len(engine.evictions)
        total = p.capacity.vram_total_mib if p.capacity else None
        providers[name] = {
            "endpoint": emulators[name].url,
            "vramMiB": total,
            "usableMiB": (total or 0) - p.spec.reserve_mib,
            "peakVramMiB": books.peak.get(name, 0),
            "requests": dict(Counter(r.model for r in engine.records)),
            "truncatedRequests": sum(1 for r in engine.records if r.truncated),
            "loads": dict(Counter(engine.loads)),
            "unloads": list(clients[name].unloads),
            "engineEvictions": list(engine.evictions),
        }
    # In the order the calls finished, as the call log and the dashboard have them; the
    # table sorts them by thread for people.
    calls = [{**r.to_dict(), "startedAt": round(r.started_at, 3),
              "waitedSeconds": _rounded(starts.wait(r))} for r in records]
    waits = [c["waitedSeconds"] for c in calls if c["waitedSeconds"] is not None]
    return {
        "store": store,
        "seed": seed,
        "timeScale": time_scale,
        "discussions": len(threads),
        "answered": sum(1 for t in threads if t.answered),
        "settlements": dict(Counter(t.settlement.value for t in threads)),
        "calls": calls,
        "loads": sum(sum(v["loads"].values()) for v in providers.values()),
        "evictions": sum(len(v["unloads"]) for v in providers.values()),
        "waits": sum(1 for s in books.signals if s.type.value == "waiting"),
        "meanWaitSeconds": _rounded(fmean(waits) if waits else None),
        "maxWaitSeconds": _rounded(max(waits, default=None)),
        "queuedCalls": sum(1 for r in records if r.action == "queue"),
        "warmCalls": sum(1 for r in records if r.action in ("warm", "loading")),
        "coldLoads": sum(1 for r in records if r.action == "cold-load"),
        "standAsides": dict(stand_asides),
        "failures": dict(failures),
        # the engines had to overrule the scheduler's budget: a VRAM excursion above a
        # card's usable memory, or a model the engine evicted on its own to make room
        "overcommits": sum(books.over.values()) + engine_evictions,
        "providers": providers,
        "threads": [{k: v for k, v in t.to_dict().items() if k != "signals"}
                    for t in threads],
        "wallSeconds": round(wall, 2),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
