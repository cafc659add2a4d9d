"""``kubemoot gateway`` — per-call placement for any Ollama or OpenAI client (DESIGN §9).

Providers come from ``--provider [NAME=]URL`` (repeatable) and ``-f BUNDLE.yaml``
(ModelProvider and Model resources); with ``--nats`` the gateway shares provider state
and tickets with the operator and other gateway replicas. It listens on loopback by
default; a non-loopback address needs ``--api-keys`` or an explicit
``--allow-anonymous``.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

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
from kubemoot.runtime.settings import DEFAULTS, GatewaySettings, RuntimeSettings

if TYPE_CHECKING:
    from kubemoot.gateway import ProviderSource
    from kubemoot.gateway.app import VirtualModels

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
    listen: str = typer.Option(_DEFAULTS.listen, "--listen", metavar="HOST:PORT",
                               help="Where to listen; loopback by default."),
    wait_limit: str = typer.Option(
        f"{_DEFAULTS.wait_limit_seconds:g}s", "--wait-limit", metavar="DURATION",
        help="How long a busy call waits for a GPU unless the client sends "
             "X-Kubemoot-Wait-Budget."),
    max_keep_alive: str = typer.Option(
        f"{_DEFAULTS.max_keep_alive_seconds / 60:g}m", "--max-keep-alive", metavar="DURATION",
        help="The longest keep_alive a client may ask for (90s, 30m, 1h)."),
    probe_interval: str = typer.Option(
        f"{_DEFAULTS.probe_interval_seconds:g}s", "--probe-interval", metavar="DURATION",
        help="How often the gateway probes its providers."),
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
    from kubemoot.gateway.keys import load_api_keys

    level = _LOG_LEVELS.get(log_level.strip().lower())
    if level is None:
        raise InputError(f"expected one of {', '.join(_LOG_LEVELS)}, got {log_level!r}",
                         field="--log-level")
    install_log_lines(level=level)  # the gateway's warnings (and access lines), one each
    # Read once: the runtime, the ModelClasses' tolerance and the shutdown all see the
    # same values (and a malformed variable is exit 2 before anything starts).
    tunables = RuntimeSettings.from_env()
    host, port = parse_listen(listen)
    check_host(host, flag="--listen")
    keys = load_api_keys(api_keys) if api_keys is not None else None
    if keys is None and not is_loopback(host) and not allow_anonymous:
        raise InputError(f"{host} is not a loopback address: give --api-keys FILE, or "
                         "--allow-anonymous to serve anyone who can reach it",
                         field="--listen")
    settings = replace(
        _DEFAULTS,
        wait_limit_seconds=parse_duration(wait_limit, "--wait-limit"),
        max_keep_alive_seconds=parse_duration(max_keep_alive, "--max-keep-alive"),
        probe_interval_seconds=parse_duration(probe_interval, "--probe-interval"),
        allowed_origins=tuple(o.strip() for o in allow_origin if o.strip()),
        allowed_hosts=tuple(h.strip() for h in allow_host if h.strip()),
    )
    sources, declared, virtual = _providers(provider, file,
                                            tolerance=tunables.candidate_tolerance)
    if not sources and nats.url is None:
        raise InputError("no provider: give --provider URL, -f BUNDLE.yaml with a "
                         "ModelProvider, or --nats to use the providers others publish",
                         field="--provider")
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

        clock = SystemClock()
        kv = await open_shared_store(nats_settings, clock=clock)
        try:
            calllog = await CallLogWriter.open(kv)
            server = GatewayServer(kv, providers=sources, host=host, port=port,
                                   settings=settings, runtime=tunables,
                                   declared=declared, keys=keys,
                                   virtual=virtual, clock=clock, on_call=[calllog.record])
            try:
                await server.start()
            except OSError as error:
                raise listen_error(host, port, error, flag="--listen") from None
            try:
                names = ", ".join(s.name for s in sources) or "none of its own"
                store = mask_servers(nats_settings.servers) if nats_settings else "embedded"
                err_console.print(
                    f"gateway: {server.url} (providers: {names}; store: {store}; "
                    f"{'API keys: ' + str(len(keys)) if keys else 'no API keys'}); "
                    "Ctrl-C stops it", highlight=False, soft_wrap=True)
                await server.wait()
            finally:
                await server.stop()
                await calllog.flush()
        finally:
            await kv.close()

    from kubemoot.cli._shutdown import run_until_stopped

    # SIGTERM (what Kubernetes sends) and Ctrl-C cancel run(): replies end, tickets are
    # released and the store closes before the process exits (143 or 130).
    run_until_stopped(run(), grace_seconds=tunables.shutdown_grace_seconds)


def _providers(
    urls: list[str], files: list[Path], *, tolerance: float
) -> tuple[list[ProviderSource], dict[str, int | None], VirtualModels | None]:
    """The providers, declared model sizes and ModelClasses of ``--provider`` and ``-f``."""
    from kubemoot.api.loader import load_bundle
    from kubemoot.gateway import ProviderSource
    from kubemoot.gateway.classes import ModelClassBook
    from kubemoot.providers.ollama import parse_endpoint

    sources: dict[str, ProviderSource] = {}
    declared: dict[str, int | None] = {}
    virtual: VirtualModels | None = None
    if files:
        bundle = load_bundle(files)
        for p in bundle.providers:
            capacity = p.status.capacity if p.status is not None else None
            sources[p.metadata.name] = ProviderSource(
                p.metadata.name, parse_endpoint(p.spec.endpoint)[1],
                context_length=p.spec.context_length, num_parallel=p.spec.num_parallel or 1,
                reserve_mib=p.spec.reserve_mib,
                total_vram_mib=capacity.vram_total_mib if capacity else None)
        declared = {m.spec.model: m.spec.vram_mib for m in bundle.models}
        if bundle.model_classes:
            virtual = ModelClassBook(
                bundle.model_classes, bundle.models, bundle.providers,
                runtime_tolerance=tolerance)
    for text in urls:
        endpoint, *settings = text.split(",")
        try:
            name, url = parse_endpoint(endpoint)
        except InputError as error:
            raise InputError(error.message, field="--provider") from None
        if name in sources:
            raise InputError(f"the provider name {name!r} is given twice",
                             field="--provider")
        values = _provider_settings(text, settings)
        sources[name] = ProviderSource(
            name, url, context_length=values.get("contextLength"),
            num_parallel=values.get("numParallel", 1),
            reserve_mib=values.get("reserveMiB", DEFAULTS.reserve_mib),
            total_vram_mib=values.get("vramMiB"))
    return list(sources.values()), declared, virtual


# What ``--provider URL,key=value…`` may say; Ollama reports none of these itself.
_PROVIDER_KEYS = ("vramMiB", "numParallel", "contextLength", "reserveMiB")


def _provider_settings(text: str, settings: list[str]) -> dict[str, int]:
    values: dict[str, int] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _PROVIDER_KEYS or not value.strip().isdigit():
            raise InputError(f"{item!r} in {text!r} is not one of "
                             f"{', '.join(k + '=N' for k in _PROVIDER_KEYS)}",
                             field="--provider")
        values[key] = int(value)
    return values
