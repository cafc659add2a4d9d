"""``kubemoot demo`` — the whole system in one process, on emulated GPUs: options and
printing.

The application itself is :mod:`kubemoot.demo` (emulators, control plane, runtime,
discussions, the report, and the ordered shutdown of :mod:`kubemoot.process`); this
module parses the options, shows progress and prints the report. With ``--nats`` the
shared store is NATS, else the embedded one. Shutdown, normal or on SIGTERM or Ctrl-C
(:mod:`kubemoot.cli._shutdown`), cancels the run, which then stops everything it
started in the one safe order, the store last.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from kubemoot.demo import Books, PageOptions, default_bundle, run_demo

if TYPE_CHECKING:
    from rich.console import JustifyMethod
    from rich.table import Table

    from kubemoot.clock import Clock
    from kubemoot.store.health import StoreHealth
    from kubemoot.store.protocol import KV


@app.command("demo")
@nats_options()
def demo_command(
    nats: NatsFlags = NO_NATS_FLAGS,
    discussions: int = typer.Option(8, "--discussions", metavar="N", min=1, max=40,
                                    help="How many discussions to run (they start staggered)."),
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
    from kubemoot.settings import Settings

    tunables = Settings.from_env()
    install_log_lines()
    shown: list[bool] = []

    def present(report: dict[str, Any]) -> None:
        shown.append(True)
        if fmt is OutputFormat.table:
            _print_report(report)
        else:
            emit_data(report, fmt)

    page = PageOptions(dashboard_port, dashboard_linger, present) if dashboard else None

    async def open_store(clock: Clock) -> KV:
        return await open_shared_store(nats_settings, clock=clock,
                                       connect_wait=tunables.process.connect_wait_seconds)

    with contextlib.ExitStack() as files:
        path = bundle if bundle is not None else files.enter_context(default_bundle())
        if not path.exists():
            raise InputError("no such bundle; pass -f with the resources to run",
                             file=str(path), field="--bundle")
        try:
            report = run_until_stopped(
                run_demo(path, open_store=open_store,
                         store="memory" if nats_settings is None else "nats",
                         discussions=discussions, seed=seed, time_scale=time_scale,
                         dashboard=page, view=_Printed(live=fmt is OutputFormat.table),
                         tunables=tunables,
                         where=mask_servers(nats_settings.servers) if nats_settings else ""),
                grace_seconds=tunables.process.shutdown_grace_seconds)
        except KeyboardInterrupt:
            # Ctrl-C before the run could take over the signal; typer would turn this
            # into a silent exit, the user gets one line instead.
            err_console.print("interrupted", highlight=False)
            raise typer.Exit(130) from None
    if not shown:
        present(report)


# -- what a person sees ----------------------------------------------------------------


class _Printed:
    """The demo's view on the terminal: progress while it runs (table output only) and
    one line for each thing a person should know, on stderr."""

    def __init__(self, *, live: bool) -> None:
        self.live = live

    async def follow(self, discussing: asyncio.Task[Any], books: Books, agents: Any,
                     total: int) -> None:
        if self.live:
            await _with_live(discussing, books, agents, total)

    def store_health_changed(self, health: StoreHealth, where: str) -> None:
        # one line when the shared store stops answering and one when it is back; the
        # failures in between are not printed one by one (see ``StoreLossFilter``)
        if health.reachable:
            _say(f"NATS at {where} answers again")
        else:
            _say(f"lost the shared state (NATS at {where}): {health.reason}; calls that "
                 "need it fail until it answers again")

    def dashboard_started(self, url: str) -> None:
        err_console.print(f"dashboard: {url}", highlight=False, soft_wrap=True)

    def dashboard_lingers(self, url: str, seconds: float | None) -> None:
        if seconds is None:
            err_console.print(f"the demo is done; the dashboard stays up at {url} "
                              "until Ctrl-C (or SIGTERM)", highlight=False, soft_wrap=True)
        elif seconds > 0:
            err_console.print(f"the demo is done; the dashboard stays up at {url} for "
                              f"{seconds:g} s (Ctrl-C stops it sooner)",
                              highlight=False, soft_wrap=True)


def _say(line: str) -> None:
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)


async def _with_live(task: asyncio.Task[Any], books: Books, agents: Any,
                     total: int) -> None:
    """Show progress on stderr until ``task`` ends (the caller owns and awaits it)."""
    from rich.live import Live

    with Live(_progress(books, agents, total), console=err_console,
              refresh_per_second=8, transient=True) as view:
        while not task.done():
            view.update(_progress(books, agents, total))
            await asyncio.wait({task}, timeout=0.125)


def _progress(books: Books, agents: Any, total: int) -> Any:
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
