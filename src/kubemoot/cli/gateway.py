"""``kubemoot gateway`` — per-call placement for any Ollama or OpenAI client (DESIGN §9).

Providers come from ``--provider [NAME=]URL`` (repeatable), ``-f BUNDLE.yaml``
(ModelProvider and Model resources) and ``-c gateway.yaml`` (a hand-written config,
reloaded on SIGHUP and when the file changes); with ``--nats`` the gateway shares
provider state and tickets with the operator and other gateway replicas. It listens on loopback by
default; a non-loopback address needs ``--api-keys`` or an explicit
``--allow-anonymous``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import app, err_console
from kubemoot.cli._nats import (
    NO_NATS_FLAGS,
    NatsFlags,
    mask_servers,
    nats_options,
    open_shared_store,
    resolve_nats,
)
from kubemoot.settings import DashboardSettings, GatewaySettings, Settings

if TYPE_CHECKING:
    from kubemoot.clock import Clock
    from kubemoot.dashboard import DashboardServer
    from kubemoot.dashboard.calllog import CallLogWriter
    from kubemoot.gateway.config import GatewayConfig
    from kubemoot.gateway.reload import GatewayFleet
    from kubemoot.store.protocol import KV

_DEFAULTS = GatewaySettings()
_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
               "error": logging.ERROR}


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) → (host, port); InputError naming --listen."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"expected HOST:PORT, got {text!r}", field="--listen")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def points_at_itself(endpoint: str, host: str, port: int) -> bool:
    """Whether a provider's endpoint is the gateway's own address: it would then probe
    itself, take its own fleet's copies for that provider's and forward calls to itself."""
    try:
        url = urlsplit(endpoint)
        there = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return False
    if there != port or url.hostname is None:
        return False
    here = host.lower()
    # a wildcard listen answers on loopback too
    mine = here in ("0.0.0.0", "::") or is_loopback(here)
    return url.hostname.lower() == here or (mine and is_loopback(url.hostname))


def parse_duration(text: str, flag: str) -> float:
    """``90``, ``90s``, ``30m``, ``1h`` → seconds (Ollama's duration syntax, but a flag
    may be neither negative nor endless)."""
    from kubemoot.providers.durations import DurationError, duration_seconds

    try:
        seconds = duration_seconds(text, field=flag)
    except DurationError:
        raise InputError(f"expected a duration such as 90s, 30m or 1h, got {text!r}",
                         field=flag) from None
    if seconds == math.inf:  # a negative duration means "forever" to Ollama
        raise InputError(f"must not be negative, got {text!r}", field=flag)
    return seconds


@app.command("gateway")
@nats_options()
def gateway_command(
    provider: list[str] = typer.Option(
        [], "--provider", metavar="[NAME=]URL[,vramMiB=N][,numParallel=N]…",
        help="An Ollama (or Ollama-API) endpoint to serve through; repeatable. Ollama "
             "does not report its card's memory: give vramMiB (and numParallel, "
             "contextLength, reserveMiB as set on that Ollama) so models can be loaded."),
    file: list[Path] = typer.Option(
        [], "-f", "--file", metavar="BUNDLE",
        help="A YAML bundle of ModelProvider, Model and ModelClass resources; repeatable."),
    config: Path | None = typer.Option(
        None, "-c", "--config", metavar="FILE",
        help="A gateway config (servers, models, classes, keys, limits; docs/gateway.md); "
             "reloaded on SIGHUP and when the file changes."),
    listen: str = typer.Option(_DEFAULTS.listen, "--listen", metavar="HOST:PORT",
                               help="Where to listen; loopback by default."),
    wait_limit: str | None = typer.Option(
        None, "--wait-limit", metavar="DURATION",
        help="How long a busy call waits for a GPU unless the client sends "
             f"X-Kubemoot-Wait-Budget (default {_DEFAULTS.wait_limit_seconds:g}s; over "
             "the config's limits.waitLimit)."),
    max_keep_alive: str | None = typer.Option(
        None, "--max-keep-alive", metavar="DURATION",
        help="The longest keep_alive a client may ask for (90s, 30m, 1h; default "
             f"{_DEFAULTS.max_keep_alive_seconds / 60:g}m)."),
    probe_interval: str | None = typer.Option(
        None, "--probe-interval", metavar="DURATION",
        help="How often the gateway probes its providers (and looks at its config "
             f"file; default {_DEFAULTS.provider_probe_seconds:g}s)."),
    api_keys: Path | None = typer.Option(
        None, "--api-keys", metavar="FILE",
        help="A file of 'name: key' lines; turns on bearer tokens."),
    allow_anonymous: bool = typer.Option(
        False, "--allow-anonymous",
        help="Allow a non-loopback address without --api-keys."),
    allow_origin: list[str] = typer.Option(
        [], "--allow-origin", metavar="ORIGIN",
        help="A browser origin allowed besides loopback ones (https://app.example, "
             "https://*.example, or * for any); repeatable. Others get 403."),
    allow_host: list[str] = typer.Option(
        [], "--allow-host", metavar="NAME",
        help="A host name clients may use in Host besides loopback, IP addresses and "
             "the --listen name; repeatable. Others get 403 (DNS rebinding)."),
    log_level: str = typer.Option(
        "warning", "--log-level", metavar="LEVEL",
        help="debug, info, warning or error; info adds one access line per request."),
    dashboard: bool = typer.Option(
        False, "--dashboard",
        help="Also serve the dashboard (the page of `kubemoot dashboard`) over this "
             "gateway's own store, embedded or NATS, at --dashboard-listen."),
    dashboard_listen: str = typer.Option(
        "127.0.0.1:8765", "--dashboard-listen", metavar="HOST:PORT",
        help="Where --dashboard serves the page; loopback by default (it has no login)."),
    nats: NatsFlags = NO_NATS_FLAGS,
) -> None:
    """Serve the Ollama and OpenAI APIs; every call is placed on a GPU by kubemoot.

    Point clients at the --listen address, http://127.0.0.1:11435 by default (OpenAI
    clients at .../v1). Give at least one --provider, a -f bundle, or --nats with
    providers published by others.
    docs/gateway.md has the client settings, statuses and headers.
    """
    from dataclasses import replace

    from kubemoot.cli._common import check_host, install_log_lines, listen_error
    from kubemoot.gateway.config import Limits, load_config
    from kubemoot.gateway.keys import load_api_keys
    from kubemoot.gateway.reload import assemble_fleet

    level = _LOG_LEVELS.get(log_level.strip().lower())
    if level is None:
        raise InputError(f"expected one of {', '.join(_LOG_LEVELS)}, got {log_level!r}",
                         field="--log-level")
    install_log_lines(level=level)  # the gateway's warnings (and access lines), one each
    # Read once: the runtime, the ModelClasses' tolerance and the shutdown all see the
    # same values (and a malformed variable is exit 2 before anything starts).
    tunables = Settings.from_env()
    host, port = parse_listen(listen)
    check_host(host, flag="--listen")
    page_at = parse_listen(dashboard_listen) if dashboard else None
    if page_at is not None:
        check_host(page_at[0], flag="--dashboard-listen")
    flag_keys = load_api_keys(api_keys) if api_keys is not None else None
    flag_limits = Limits(
        *(None if text is None else parse_duration(text, flag)
          for text, flag in ((wait_limit, "--wait-limit"),
                             (max_keep_alive, "--max-keep-alive"),
                             (probe_interval, "--probe-interval"))))

    # The browser guard comes from flags only: a reload keeps it.
    guarded = replace(_DEFAULTS,
                      allowed_origins=tuple(o.strip() for o in allow_origin if o.strip()),
                      allowed_hosts=tuple(h.strip() for h in allow_host if h.strip()))

    def build(config: GatewayConfig | None) -> GatewayFleet:
        # the whole fleet for one reading of the config; a reload calls it again
        fleet = assemble_fleet(config, urls=provider, files=file, flag_keys=flag_keys,
                               flag_limits=flag_limits,
                               tolerance=tunables.runtime.candidate_tolerance,
                               base=guarded)
        if fleet.keys is None and not is_loopback(host) and not allow_anonymous:
            raise InputError(f"{host} is not a loopback address: give --api-keys FILE (or "
                             "keys: in the config), or --allow-anonymous to serve anyone "
                             "who can reach it", field="--listen")
        for source in fleet.providers:
            if points_at_itself(source.endpoint, host, port):
                raise InputError(
                    f"provider {source.name} has the gateway's own address "
                    f"{source.endpoint}: the gateway would call itself; give that server's "
                    "own address, or the gateway another --listen", field="--provider")
        if not fleet.providers and nats.url is None:
            raise InputError("no provider: give --provider URL, -f BUNDLE.yaml with a "
                             "ModelProvider, servers: in -c FILE, or --nats to use the "
                             "providers others publish", field="--provider")
        return fleet

    first = build(load_config(config) if config is not None else None)
    sources, keys, settings = first.providers, first.keys, first.settings
    nats_settings = resolve_nats(nats, use_nats=nats.url is not None)

    for source in sources:
        if source.total_vram_mib is None:
            err_console.print(
                f"warning: the memory of provider {source.name} is unknown, so the gateway "
                "can only use the models it already holds; add ,vramMiB=N to its "
                "--provider (or status.capacity.vramTotalMiB in the bundle)",
                highlight=False, soft_wrap=True)

    async def run() -> None:
        from kubemoot.clock import SystemClock
        from kubemoot.dashboard.calllog import CallLogWriter
        from kubemoot.gateway import GatewayServer
        from kubemoot.gateway.server import collect_less
        from kubemoot.process import Lifecycle, Stage
        from kubemoot.providers.factory import ProviderClients

        clock = SystemClock()
        # What started is stopped in one order (kubemoot.process): the dashboard, the
        # gateway (its replies drain, its calls give their tickets back), the call log's
        # last entries, the runtime's leftovers, and the store last.
        process = Lifecycle(straggler_grace=tunables.process.straggler_grace_seconds)
        try:
            kv = await open_shared_store(
                nats_settings, clock=clock, connect_wait=tunables.process.connect_wait_seconds)
            process.on_stop(Stage.STORE, kv.close, name="store")
            calllog = await CallLogWriter.open(kv)
            grace = tunables.process.straggler_grace_seconds
            process.on_stop(Stage.RUNTIME, lambda: _flush(calllog, grace), name="call log")
            server = GatewayServer(kv, providers=sources, host=host, port=port,
                                   settings=settings, runtime=tunables.runtime,
                                   process=tunables.process,
                                   client_factory=ProviderClients.of(tunables.runtime,
                                                                     clock=clock),
                                   declared=first.declared, keys=keys,
                                   virtual=first.virtual, clock=clock,
                                   on_call=[calllog.record])
            process.on_stop(Stage.RUNTIME, server.stop, name="gateway")
            if config is not None:
                _reload_on_change(server, config, build)
            try:
                await server.start()
            except OSError as error:
                raise listen_error(host, port, error, flag="--listen") from None
            names = ", ".join(s.name for s in sources) or "none of its own"
            store = mask_servers(nats_settings.servers) if nats_settings else "embedded"
            if page_at is not None:
                page = await _serve_dashboard(kv, clock, page_at, tunables.dashboard)
                process.on_stop(Stage.RUNTIME, page.stop, name="dashboard")
            collect_less()  # everything built to serve is built: the collector may skip it
            err_console.print(
                f"gateway: {server.url} (providers: {names}; store: {store}; "
                f"{'API keys: ' + str(len(keys)) if keys else 'no API keys'}); "
                "Ctrl-C stops it", highlight=False, soft_wrap=True)
            await server.wait()
        finally:
            await process.shutdown()

    from kubemoot.cli._shutdown import run_until_stopped
    from kubemoot.serving import event_loop_factory

    # SIGTERM (what Kubernetes sends) and Ctrl-C cancel run(): replies end, tickets are
    # released and the store closes before the process exits (143 or 130). uvloop, when
    # installed, runs the loop: the gateway's hot path is mostly the loop's own work.
    run_until_stopped(run(), grace_seconds=tunables.process.shutdown_grace_seconds,
                      loop_factory=event_loop_factory())


async def _flush(calllog: CallLogWriter, grace: float) -> None:
    """The call log's last entries, before the store closes under them; a store too slow
    to take them within ``grace`` loses them rather than holding up the exit."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(calllog.flush(), grace)


async def _serve_dashboard(kv: KV, clock: Clock, where: tuple[str, int],
                           settings: DashboardSettings) -> DashboardServer:
    """The dashboard over the gateway's own store: on the embedded store nothing else can
    read it, and on NATS it saves running ``kubemoot dashboard`` beside the gateway.
    Assembled here because the gateway package may not import another adapter."""
    from kubemoot.cli._common import listen_error
    from kubemoot.dashboard import DashboardServer

    host, port = where
    page = DashboardServer(
        kv, host=host, port=port, clock=clock,
        settings=settings.allowing([host]))
    try:
        await page.start()
    except OSError as error:
        raise listen_error(host, port, error, flag="--dashboard-listen") from None
    err_console.print(f"dashboard: {page.url}", highlight=False, soft_wrap=True)
    return page


def _reload_on_change(server: object, config: Path,
                      build: Callable[[GatewayConfig], GatewayFleet]) -> None:
    """Reload ``config`` into the server on SIGHUP and when the file changes (looked at
    once per probe tick)."""
    import asyncio
    import signal

    from kubemoot.gateway import GatewayServer
    from kubemoot.gateway.reload import ConfigReloader

    assert isinstance(server, GatewayServer)
    reloader = ConfigReloader(
        config, server, build,
        announce=lambda line: err_console.print(line, highlight=False, soft_wrap=True))
    server.before_probe = reloader.check
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[bool]] = set()

    def on_hangup() -> None:
        task = loop.create_task(reloader.reload("SIGHUP"))
        pending.add(task)  # held until done, so the task is not collected midway
        task.add_done_callback(pending.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hangup)
