"""``kubemoot demo`` — the whole system in one process, on emulated GPUs.

It starts one Ollama-API **emulator** per ModelProvider of the bundle (by default the
homelab bundle shipped inside the package, also at ``examples/homelab`` in the
repository: a 32 GiB and a 24 GiB card), runs the control plane over the
bundle, probes the emulators into the shared store (the embedded store, or NATS with
``--nats``), and runs several discussions at once through the per-call runtime. Every
call is attributed to the provider it really ran on; the emulators' own books (requests
received, loads, peak VRAM) are printed beside the runtime's, so the two can be checked
against each other. The emulators run faster than real time (``--time-scale``), and the
runtime's cost settings are scaled to match, so every cost stays in real seconds.

Shutdown, normal or on SIGTERM or Ctrl-C (:mod:`kubemoot.cli._shutdown`), runs in one
order: every task of the run is cancelled and awaited (discussions, prober, sampler,
then whatever the runtime still has in flight), then the runtime stack and the clients
close, then the emulators stop, and the store closes last, so nothing still running
ever finds the store closed under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any, NamedTuple

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import (
    OUTPUT_OPTION_HELP,
    OutputFormat,
    add_name_column,
    app,
    console,
    emit_data,
    err_console,
    install_log_lines,
    resolve_format,
)
from kubemoot.cli._nats import (
    NO_NATS_FLAGS,
    NatsFlags,
    mask_servers,
    nats_options,
    open_shared_store,
    resolve_nats,
)

if TYPE_CHECKING:
    from rich.console import JustifyMethod
    from rich.table import Table

    from kubemoot.agent.discussion import DiscussionResult
    from kubemoot.agent.signals import Signal
    from kubemoot.agent.wiring import RuntimeStack
    from kubemoot.dashboard import DashboardServer
    from kubemoot.dashboard.calllog import CallLogWriter
    from kubemoot.emulation.server import OllamaEmulator
    from kubemoot.providers.ollama import OllamaProvider
    from kubemoot.runtime.settings import RuntimeSettings
    from kubemoot.store.health import StoreHealth
    from kubemoot.store.nats import NatsSettings
    from kubemoot.store.protocol import KV

# The default bundle is package data, so the demo runs from any directory after any
# kind of install; the repository's examples/homelab is a link to the same files.
DEFAULT_BUNDLE_PARTS = ("examples", "homelab")
# Emulated seconds per call: a fixed part plus a part per generated token (8–31 tokens).
CALL_BASE_SECONDS = 2.0
CALL_PER_TOKEN_SECONDS = 0.3
CALL_PER_PROMPT_TOKEN_SECONDS = 0.0
PROBE_INTERVAL_SECONDS = 0.25
SAMPLE_INTERVAL_SECONDS = 0.01


@app.command("demo")
@nats_options()
def demo_command(
    nats: NatsFlags = NO_NATS_FLAGS,
    discussions: int = typer.Option(8, "--discussions", metavar="N", min=1, max=40,
                                    help="How many discussions to run at once."),
    seed: int = typer.Option(7, "--seed", metavar="N",
        help="Chooses questions, members and start times."),
    output: OutputFormat | None = typer.Option(None, "-o", "--output", help=OUTPUT_OPTION_HELP),
    dashboard: bool = typer.Option(False, "--dashboard", help="Also serve the dashboard."),
    dashboard_port: int = typer.Option(
        8765, "--dashboard-port", metavar="PORT", min=0, max=65535,
        help="Dashboard port (0: any free)."
    ),
    dashboard_linger: float | None = typer.Option(
        None, "--dashboard-linger", metavar="SECONDS", min=0.0,
        help="Seconds the dashboard stays up after the demo (default: until Ctrl-C).",
    ),
    bundle: Path | None = typer.Option(
        None, "-f", "--bundle", metavar="FILE",
        help="Resources to run (default: the homelab bundle shipped with kubemoot).",
    ),
    time_scale: float = typer.Option(
        0.08, "--time-scale", metavar="SCALE", min=0.001, max=1.0,
        help="Real seconds per emulated second (1 = as slow as real GPUs).",
    ),
) -> None:
    """Run crews on emulated GPUs through the scheduler and show where each call ran."""
    fmt = resolve_format(output)
    # --nats picks NATS over the embedded store; the other flags only tune the connection.
    nats_settings = resolve_nats(nats, use_nats=nats.url is not None)
    from kubemoot.cli._shutdown import run_until_stopped
    from kubemoot.runtime.settings import RuntimeSettings

    tunables = RuntimeSettings.from_env()
    install_log_lines()
    shown: list[bool] = []

    def present(report: dict[str, Any]) -> None:
        shown.append(True)
        if fmt is OutputFormat.table:
            _print_report(report)
        else:
            emit_data(report, fmt)

    page = _PageOptions(dashboard_port, dashboard_linger, present) if dashboard else None
    with contextlib.ExitStack() as files:
        path = bundle if bundle is not None else files.enter_context(default_bundle())
        if not path.exists():
            raise InputError("no such bundle; pass -f with the resources to run",
                             file=str(path), field="--bundle")
        try:
            report = run_until_stopped(
                _run(path, nats=nats_settings, discussions=discussions, seed=seed,
                     time_scale=time_scale, dashboard=page, live=fmt is OutputFormat.table,
                     tunables=tunables),
                grace_seconds=tunables.shutdown_grace_seconds)
        except KeyboardInterrupt:
            # Ctrl-C before the run could take over the signal; typer would turn this
            # into a silent exit, the user gets one line instead.
            err_console.print("interrupted", highlight=False)
            raise typer.Exit(130) from None
    if not shown:
        present(report)


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


class _Books:
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


async def _run(path: Path, *, nats: NatsSettings | None, discussions: int, seed: int,
               time_scale: float, dashboard: _PageOptions | None,
               live: bool, tunables: RuntimeSettings) -> dict[str, Any]:
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
    books = _Books()
    run = _Running(straggler_grace=tunables.straggler_grace_seconds)
    try:
        await _start_emulators(resources, time_scale, into=run.emulators)
        emulators = run.emulators
        kv = run.kv = await open_shared_store(nats, clock=clock,
                                              connect_wait=tunables.connect_wait_seconds)
        clients = run.clients
        for p in resources.providers:
            clients[p.metadata.name] = _counting_provider(
                p, emulators[p.metadata.name].url,
                timeout=tunables.provider_read_timeout_seconds)
        states = await kv.bucket(PROVIDER_STATE_BUCKET)
        prober = Prober(list(clients.values()), clock=clock, publish=publish_to_kv(states))
        if nats is not None:
            run.tasks.append(asyncio.create_task(_tell_store_health(
                StoreHealth(states, clock=clock, every=tunables.store_check_seconds),
                mask_servers(nats.servers))))
        await prober.probe_all()

        async def after_call(provider: str) -> None:
            await prober.probe_one(clients[provider])

        starts = _InferenceStarts(clock, time_scale)

        def factory(provider: str, endpoint: str, settings: CallSettings) -> OllamaProvider:
            return starts.client(provider, endpoint, timeout=settings.timeout)

        # The emulators run time_scale real seconds per emulated second; the runtime's
        # times (as set in KUBEMOOT_*, else the defaults) are scaled alike.
        settings = tunables.with_values({
            "load_rate_mibps": tunables.load_rate_mibps / time_scale,
            "unload_seconds": tunables.unload_seconds * time_scale,
            "default_latency_seconds": tunables.default_latency_seconds * time_scale,
            "gpu_wait_limit_seconds": tunables.gpu_wait_limit_seconds * time_scale,
        })
        declared = {m.spec.model: m.spec.vram_mib for m in resources.models
                    if m.spec.vram_mib is not None}
        stack = run.stack = await build_stack(
            kv, clients=clients, client_factory=factory, clock=clock, settings=settings,
            declared=declared, after_call=after_call)
        run.tasks.append(asyncio.create_task(prober.run(PROBE_INTERVAL_SECONDS)))
        run.tasks.append(asyncio.create_task(_sample(emulators, resources, books)))
        # Every finished call goes to the call log, so any dashboard on this store
        # (in this process with --dashboard, or `kubemoot dashboard --nats`) shows it.
        calllog = run.calllog = await CallLogWriter.open(kv)
        stack.agents.on_record(calllog.record)
        stack.agents.on_record(starts.attach)
        if dashboard is not None:
            run.page = await _start_dashboard(kv, clock, dashboard.port, tunables)
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
        run.tasks.insert(0, discussing)
        if live:
            await _with_live(discussing, books, stack.agents, discussions)
        threads = await discussing
        report = _report(threads, stack.agents.records, starts, books, emulators, clients,
                         resources, store="nats" if nats else "memory", seed=seed,
                         time_scale=time_scale, wall=time.monotonic() - started)
        await calllog.flush()
        if run.page is not None and dashboard is not None:
            dashboard.present(report)
            await _linger(run.page, dashboard.linger)
        return report
    finally:
        await run.shutdown()


async def _tell_store_health(health: StoreHealth, where: str) -> None:
    """One line when the shared store stops answering and one when it is back.

    The failures in between are not printed one by one (see ``StoreLossFilter``).
    """
    async def tell(health: StoreHealth) -> None:
        if health.reachable:
            err_console.print(f"NATS at {where} answers again", highlight=False,
                              markup=False, soft_wrap=True)
        else:
            err_console.print(f"lost the shared state (NATS at {where}): {health.reason}; "
                              "calls that need it fail until it answers again",
                              highlight=False, markup=False, soft_wrap=True)

    health.on_change(tell)
    await health.run()


class _Running:
    """What a run has started so far, and how to stop it in the one safe order."""

    def __init__(self, *, straggler_grace: float) -> None:
        self.straggler_grace = straggler_grace
        self.emulators: dict[str, OllamaEmulator] = {}
        self.clients: dict[str, OllamaProvider] = {}
        self.kv: KV | None = None
        self.stack: RuntimeStack | None = None
        self.calllog: CallLogWriter | None = None
        self.page: DashboardServer | None = None
        self.tasks: list[asyncio.Task[Any]] = []

    async def shutdown(self) -> None:
        # 1. Our own tasks: cancelling the discussions cancels every call in flight,
        #    and each call gives its ticket back while the store is still open.
        for task in self.tasks:
            task.cancel()
        await _settle(self.tasks)
        if self.page is not None:
            await self.page.stop()
        # 2. The runtime stack: its watches and followers stop, its chat clients close.
        if self.stack is not None:
            with contextlib.suppress(Exception):
                await self.stack.close()
        # 3. What the runtime started on its own (ticket lanes, call-log writes,
        #    preloads): a short grace to finish against the still-open store, then
        #    cancelled as well. Then the planner's clients, so no connection stays open.
        if self.calllog is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.calllog.flush(), self.straggler_grace)
        await _finish_stragglers(self.straggler_grace)
        for client in self.clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        # 4. The emulators. An interrupted run may leave a request half served; the
        #    engine's complaint about it at shutdown is expected, not news.
        if self.emulators:
            logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
            await asyncio.gather(*(asyncio.to_thread(e.stop) for e in self.emulators.values()))
        # 5. The store, last: nothing is left that could still write to it.
        if self.kv is not None:
            await self.kv.close()


async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait for ``tasks`` to end; their errors are theirs (already reported or moot)."""
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def _finish_stragglers(grace: float) -> None:
    """Give the runtime's leftover tasks ``grace`` seconds, then cancel and await them.

    Only tasks running kubemoot code outside the store count: the store's own tasks
    (a NATS client's reader and pinger) belong to it and end when it closes, last.
    Finishing one task may start another (a claim granted to a caller that had gone
    away starts the release of that orphan), so this looks again until none is left.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    current = asyncio.current_task()
    while True:
        others = [t for t in asyncio.all_tasks() if t is not current and _runtime_task(t)]
        if not others:
            return
        remaining = deadline - loop.time()
        if remaining <= 0:
            for task in others:
                task.cancel()
            await _settle(others)
            return
        await asyncio.wait(others, timeout=remaining)


def _runtime_task(task: asyncio.Task[Any]) -> bool:
    import kubemoot

    code = getattr(task.get_coro(), "cr_code", None)
    if code is None:
        return False
    package = Path(kubemoot.__file__).parent
    where = Path(code.co_filename)
    return where.is_relative_to(package) and not where.is_relative_to(package / "store")


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


def _counting_provider(provider: Any, url: str, *, timeout: float) -> OllamaProvider:
    """The planner's client for a provider; it remembers each model it unloaded."""
    from kubemoot.providers.ollama import OllamaProvider

    class Counting(OllamaProvider):
        unloads: list[str]

        async def unload(self, model: str) -> None:
            self.unloads.append(model)
            await super().unload(model)

    capacity = provider.capacity
    client = Counting(
        provider.metadata.name, url, context_length=provider.spec.context_length,
        num_parallel=provider.spec.num_parallel or 1, reserve_mib=provider.spec.reserve_mib,
        total_vram_mib=capacity.vram_total_mib if capacity else None, timeout=timeout,
    )
    client.unloads = []
    return client


async def _sample(emulators: dict[str, OllamaEmulator], resources: Any, books: _Books) -> None:
    """Watch each emulator's resident VRAM against the budget the scheduler keeps."""
    usable = {p.metadata.name: (p.capacity.vram_total_mib if p.capacity else 0) or 0
              for p in resources.providers}
    reserve = {p.metadata.name: p.spec.reserve_mib for p in resources.providers}
    while True:
        for name, emulator in emulators.items():
            books.sample(name, emulator.engine.card.used_mib, usable[name] - reserve[name])
        await asyncio.sleep(SAMPLE_INTERVAL_SECONDS)


class _InferenceStarts:
    """When each call's engine began its first inference: the demo's ``wait`` ends there.

    ``wait`` means what it means in the simulator: from issuing the call to the start of
    inference, whether the time went to waiting for a GPU, a load, or a slot in the
    engine's line. The engines do not report their line, but the demo set how long each
    reply computes (:func:`_emulated_inference_seconds`), so a reply's arrival less that
    time is when the engine started on it. The asyncio task joins the two halves: a
    call's model requests and its record are made by the same task.
    """

    def __init__(self, clock: Any, time_scale: float) -> None:
        from kubemoot.providers.ollama import OllamaProvider

        self._clock = clock
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

        self._client_type = Timed

    def client(self, provider: str, endpoint: str, *, timeout: float | None) -> OllamaProvider:
        return self._client_type(provider, endpoint, timeout=timeout, clock=self._clock)

    def _replied(self, eval_count: int | None, prompt_tokens: int | None) -> None:
        task = asyncio.current_task()
        if task is None or task in self._pending:
            return  # a later turn of a tool loop: the call had started already
        computing = _emulated_inference_seconds(eval_count or 0, prompt_tokens or 0)
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


def _emulated_inference_seconds(eval_count: int, prompt_tokens: int) -> float:
    """How long the demo's emulators compute one reply (the latency they are given)."""
    return (CALL_BASE_SECONDS + CALL_PER_TOKEN_SECONDS * eval_count
            + CALL_PER_PROMPT_TOKEN_SECONDS * prompt_tokens)


class _PageOptions(NamedTuple):
    """``--dashboard``: where to serve it, how long to keep it, how to show the report."""

    port: int
    linger: float | None
    present: Callable[[dict[str, Any]], None]


async def _start_dashboard(kv: Any, clock: Any, port: int,
                           tunables: RuntimeSettings) -> DashboardServer:
    from kubemoot.dashboard import DashboardServer
    from kubemoot.dashboard.app import DashboardSettings

    page = DashboardServer(kv, port=port, clock=clock,
                           settings=DashboardSettings.from_runtime(tunables))
    try:
        await page.start()
    except OSError as error:
        raise InputError(f"cannot serve the dashboard on port {port}: "
                         f"{error.strerror or error}", field="--dashboard-port") from None
    err_console.print(f"dashboard: {page.url}", highlight=False, soft_wrap=True)
    return page


async def _linger(page: DashboardServer, seconds: float | None) -> None:
    """Keep the page up after the demo so the final placement can be looked at."""
    if seconds is None:
        err_console.print(f"the demo is done; the dashboard stays up at {page.url} "
                          "until Ctrl-C (or SIGTERM)", highlight=False, soft_wrap=True)
        await page.wait()
    elif seconds > 0:
        err_console.print(f"the demo is done; the dashboard stays up at {page.url} for "
                          f"{seconds:g} s (Ctrl-C stops it sooner)",
                          highlight=False, soft_wrap=True)
        await asyncio.sleep(seconds)


async def _with_live(task: asyncio.Task[Any], books: _Books, agents: Any,
                     total: int) -> None:
    """Show progress on stderr until ``task`` ends (the caller owns and awaits it)."""
    from rich.live import Live

    with Live(_progress(books, agents, total), console=err_console,
              refresh_per_second=8, transient=True) as view:
        while not task.done():
            view.update(_progress(books, agents, total))
            await asyncio.wait({task}, timeout=0.125)


def _progress(books: _Books, agents: Any, total: int) -> Any:
    from rich.table import Table

    table = Table(title="kubemoot demo (emulated GPUs)", title_justify="left")
    for column in ("calls", "waiting", "stand-asides", "latest"):
        table.add_column(column)
    waiting = sum(1 for s in books.signals if s.type.value == "waiting")
    asides = sum(1 for s in books.signals if s.type.value == "stand_aside")
    latest = agents.records[-1] if agents.records else None
    where = (f"{latest.agent} {latest.phase} → {latest.model} on {latest.provider}"
             if latest is not None else "placing…")
    table.add_row(str(len(agents.records)), str(waiting), str(asides), where)
    return table


# -- the report ------------------------------------------------------------------------


def _report(threads: list[DiscussionResult], records: list[Any], starts: _InferenceStarts,
            books: _Books, emulators: dict[str, OllamaEmulator], clients: dict[str, Any],
            resources: Any,
            *, store: str, seed: int, time_scale: float, wall: float) -> dict[str, Any]:
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


# What each action did, for the line under the table (only actions that occur are told).
ACTION_MEANINGS = {
    "warm": "ran on a loaded copy",
    "loading": "joined a copy being loaded",
    "queue": "waited for a slot on a busy copy",
    "cold-load": "loaded the model into free memory",
    "unload": "unloaded idle models, then loaded",
    "static": "the bound GPU, since the call could not wait",
}


def attribution_table(calls: list[dict[str, Any]]) -> Table:
    """The per-call table, laid out to stay readable in 80 columns.

    Model, provider, phase and action are what a reader checks, so they never wrap or
    shrink; agents lose their namespace, threads their ``thread-`` prefix, and evicted
    models go one per line. Only the agent column may fold, and only when a bundle's
    names are longer than the homelab's. Rows come by thread, then by issue time; the
    caption says what ``wait`` and every action shown mean.
    """
    from rich import box
    from rich.table import Table

    ordered = sorted(calls, key=_call_order)
    rows = [(_short_thread(c["threadId"]), str(c["agent"]).rsplit("/", 1)[-1], c["phase"],
             c["model"] or "-", c["provider"] or "-", c["action"],
             _seconds(c["waitedSeconds"]), "\n".join(c["evicted"]) or "-") for c in ordered]
    table = Table(title="Per-call attribution", title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  caption=action_legend(c["action"] for c in ordered),
                  caption_justify="left")

    def fixed(header: str, index: int, *, justify: JustifyMethod = "left") -> None:
        add_name_column(table, header, (row[index] for row in rows), justify=justify)

    fixed("#", 0, justify="right")
    table.add_column("agent", overflow="fold")
    fixed("phase", 2)
    fixed("model", 3)
    fixed("provider", 4)
    fixed("action", 5)
    fixed("wait", 6, justify="right")
    table.add_column("evicted", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def action_legend(actions: Iterable[str]) -> str:
    """The line under the table: the columns' units, then each action that occurs."""
    seen = set(actions)
    told = "; ".join(f"{action}: {meaning}" for action, meaning in ACTION_MEANINGS.items()
                     if action in seen)
    unknown = sorted(seen - ACTION_MEANINGS.keys())
    told = "; ".join(filter(None, [told, *unknown]))
    return ("#: thread. wait: seconds from issuing the call to the start of inference."
            + (f" {told}." if told else ""))


def _call_order(call: dict[str, Any]) -> tuple[int, str, float]:
    """Threads in number order (thread-2 before thread-10), then calls as issued."""
    thread = _short_thread(str(call["threadId"]))
    number = int(thread) if thread.isdecimal() else -1
    return number, thread, float(call.get("startedAt") or 0.0)


def _short_thread(thread_id: str) -> str:
    return thread_id.removeprefix("thread-")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _seconds(value: float | None) -> str:
    """Four characters up to 999 s: hundredths only where they are worth the room."""
    if value is None:
        return "-"
    return next((text for text in (f"{value:.2f}", f"{value:.1f}") if len(text) <= 4),
                f"{value:.0f}")


def _print_report(report: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(attribution_table(report["calls"]))
    summary = Table(title="Summary", title_justify="left", show_header=False)
    summary.add_column("what")
    summary.add_column("value")
    rows = [
        ("store", report["store"]),
        ("discussions", str(report["discussions"])),
        ("answered", str(report["answered"])),
        ("calls", str(len(report["calls"]))),
        ("warm / queued / cold-load calls",
         f"{report['warmCalls']} / {report['queuedCalls']} / {report['coldLoads']}"),
        ("engine loads", str(report["loads"])),
        ("evictions (planned unloads)", str(report["evictions"])),
        ("wait, mean / longest", f"{_seconds(report['meanWaitSeconds'])} / "
                                  f"{_seconds(report['maxWaitSeconds'])} s"),
        ("times no GPU was free at once", str(report["waits"])),
        ("stand-asides", _counts(report["standAsides"])),
        ("failures", _counts(report["failures"])),
        ("overcommits", str(report["overcommits"])),
        ("wall time", f"{report['wallSeconds']} s"),
    ]
    for name, provider in report["providers"].items():
        rows.append((f"{name} peak VRAM",
                     f"{provider['peakVramMiB']} of {provider['usableMiB']} MiB usable"))
    for row in rows:
        summary.add_row(*row)
    console.print(summary)
    for thread in report["threads"]:
        console.print(f"[bold]{thread['threadId']}[/] ({thread['settlement']}): "
                      f"{escape(thread['question'])}\n  → {escape(thread['answer'])}",
                      highlight=False)
    console.print("[dim]GPUs are emulated (an Ollama-API emulator, not Ollama).[/]")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"
