"""``kubemoot probe ENDPOINT…`` — what each Ollama-API endpoint holds now.

Prints the provider-state document the prober would publish. A provider that is down
is not an error of the command: its state says ``ready: false`` and why, and the exit
status stays 0. A malformed endpoint is bad input (exit 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import (
    OUTPUT_OPTION_HELP,
    OutputFormat,
    app,
    console,
    emit_data,
    resolve_format,
)

if TYPE_CHECKING:
    from kubemoot.store.documents import ProviderState


@app.command("probe")
def probe_command(
    endpoints: list[str] = typer.Argument(
        ..., metavar="ENDPOINT...", show_default=False,
        help="Ollama-API endpoints, each URL or NAME=URL (e.g. gpu-a=http://host:11434).",
    ),
    context_length: int | None = typer.Option(
        None, "--context-length", min=1,
        help="Per-slot context the engine was started with (OLLAMA_CONTEXT_LENGTH).",
    ),
    num_parallel: int = typer.Option(
        1, "--num-parallel", min=1, help="Parallel slots per model (OLLAMA_NUM_PARALLEL)."
    ),
    vram_mib: int | None = typer.Option(
        None, "--vram-mib", min=1, help="Total VRAM in MiB when no DCGM exporter reports it."
    ),
    reserve_mib: int = typer.Option(1024, "--reserve-mib", min=0, help="VRAM kept free."),
    dcgm: str | None = typer.Option(
        None, "--dcgm", help="DCGM exporter metrics URL (for a single endpoint)."
    ),
    timeout: float = typer.Option(
        10.0, "--timeout", min=0.01,
        help="Seconds one endpoint's probe may take in all (a slow trickle counts too).",
    ),
    output: OutputFormat | None = typer.Option(None, "-o", "--output", help=OUTPUT_OPTION_HELP),
) -> None:
    """Probe Ollama-API endpoints and print their provider state."""
    import asyncio

    from kubemoot.clock import SystemClock
    from kubemoot.providers.ollama import OllamaProvider, parse_endpoint
    from kubemoot.providers.prober import Prober

    for text in endpoints:
        name, sep, _url = text.partition("=")
        if sep and not name.strip():
            raise InputError(f"{text!r} has an empty NAME before '='; give NAME=URL or just "
                             "URL", field="endpoint")
    if dcgm is not None:
        _check_dcgm_url(dcgm)
    parsed = [parse_endpoint(text) for text in endpoints]
    names = [name for name, _ in parsed]
    if len(set(names)) != len(names):
        raise InputError("two endpoints share a provider name; give each NAME=URL",
                         field="endpoint")
    if dcgm is not None and len(parsed) > 1:
        raise InputError("--dcgm applies to one endpoint only", field="--dcgm")

    async def run() -> list[ProviderState]:
        clock = SystemClock()
        clients = [
            OllamaProvider(name, url, context_length=context_length,
                           num_parallel=num_parallel, reserve_mib=reserve_mib,
                           total_vram_mib=vram_mib, timeout=timeout, deadline=timeout,
                           max_retries=0,
                           clock=clock, dcgm_url=dcgm)
            for name, url in parsed
        ]
        try:
            return await Prober(clients, clock=clock).probe_all()
        finally:
            for client in clients:
                await client.close()

    states = asyncio.run(run())
    fmt = resolve_format(output)
    if fmt is OutputFormat.table:
        _print_table(states)
    else:
        emit_data([s.model_dump(mode="json", by_alias=True) for s in states], fmt)


def _check_dcgm_url(url: str) -> None:
    """``--dcgm`` must be an http(s) URL with a host: a typo is bad input, not a warning."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port raises for a malformed one
    except ValueError as error:
        raise InputError(f"{url!r} is not a URL: {error}", field="--dcgm") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(
        c.isspace() for c in url
    ):
        raise InputError(
            f"{url!r} is not a DCGM exporter URL; expected http(s)://HOST[:PORT]/metrics",
            field="--dcgm",
        )


def _mib(value: int | None) -> str:
    return "unknown" if value is None else f"{value} MiB"


def _print_table(states: list[ProviderState]) -> None:
    from rich.table import Table

    table = Table(title="Provider state")
    for header in ("provider", "endpoint", "ready", "VRAM used/total", "slots", "context",
                   "loaded models"):
        table.add_column(header)
    for s in states:
        ready = "[green]yes[/]" if s.ready else "[red]no[/]"
        loaded = ", ".join(
            f"{m.name} ({m.size_mib} MiB, ctx {m.context_length or '?'})"
            for m in s.loaded_models
        ) or "-"
        used = "unknown" if s.used_vram_mib is None else str(s.used_vram_mib)
        table.add_row(s.provider, s.endpoint, ready, f"{used} / {_mib(s.total_vram_mib)}",
                      str(s.max_parallel), str(s.context_length or "unknown"), loaded)
    console.print(table)
    for s in states:
        if not s.ready:  # reasons are long; a column would crush the table
            console.print(f"[red]{s.provider} not ready:[/] {s.reason or 'unknown'}",
                          highlight=False)
