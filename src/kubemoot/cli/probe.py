"""``kubemoot probe ENDPOINT…`` — what each Ollama-API endpoint holds now.

Prints the provider-state document the prober would publish, or with ``-o state`` a
``PlacementState`` snapshot of the whole fleet that ``kubemoot place -f`` reads, so a
what-if against one's own servers is two commands. Options that describe a card
(``--vram-mib``, ``--context-length``, ``--num-parallel``, ``--reserve-mib``,
``--dcgm``) take ``VALUE`` for every endpoint or ``NAME=VALUE`` for one, and may be
repeated: two cards of different sizes are probed in one run.

A provider that is down is not an error of the command: its state says ``ready: false``
and why, and the exit status stays 0. A malformed endpoint or option is bad input
(exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import OutputFormat as _DataFormat
from kubemoot.cli._common import add_name_column, app, console, emit_data
from kubemoot.settings import DEFAULTS

if TYPE_CHECKING:
    from kubemoot.store.documents import ProviderState

T = TypeVar("T")


class ProbeFormat(StrEnum):
    """``-o``: the usual three, plus ``state`` (a PlacementState for ``kubemoot place``)."""

    table = "table"
    json = "json"
    yaml = "yaml"
    state = "state"


# Characters of table width a provider's name may claim (see _print_table).
NAME_ROOM = 20
PER_PROVIDER = "VALUE for every endpoint or NAME=VALUE for one; repeatable."


@app.command("probe")
def probe_command(
    endpoints: list[str] | None = typer.Argument(
        None, metavar="ENDPOINT", show_default=False,
        help="Ollama-API endpoints, each URL or NAME=URL (e.g. gpu-a=http://host:11434).",
    ),
    providers: list[str] = typer.Option(
        [], "--provider", metavar="[NAME=]URL[,vramMiB=N]…",
        help="An endpoint with its settings, exactly as the gateway takes it: "
        "NAME=URL,vramMiB=N,numParallel=N,contextLength=N,reserveMiB=N (repeatable).",
    ),
    context_length: list[str] = typer.Option(
        [], "--context-length", metavar="[NAME=]N",
        help="Per-slot context the engine was started with (OLLAMA_CONTEXT_LENGTH). "
        + PER_PROVIDER,
    ),
    num_parallel: list[str] = typer.Option(
        [], "--num-parallel", metavar="[NAME=]N",
        help="Parallel slots per model (OLLAMA_NUM_PARALLEL; default 1). " + PER_PROVIDER,
    ),
    vram_mib: list[str] = typer.Option(
        [], "--vram-mib", metavar="[NAME=]MiB",
        help="Total VRAM when no DCGM exporter reports it. " + PER_PROVIDER,
    ),
    reserve_mib: list[str] = typer.Option(
        [], "--reserve-mib", metavar="[NAME=]MiB",
        help=f"VRAM kept free (default: the runtime's reserve, {DEFAULTS.reserve_mib}). "
        + PER_PROVIDER,
    ),
    dcgm: list[str] = typer.Option(
        [], "--dcgm", metavar="[NAME=]URL",
        help="DCGM exporter metrics URL: URL with one endpoint, NAME=URL with several.",
    ),
    timeout: float = typer.Option(
        10.0, "--timeout", metavar="SECONDS", min=0.01,
        help="Seconds one endpoint's probe may take in all (a slow trickle counts too).",
    ),
    output: ProbeFormat | None = typer.Option(
        None, "-o", "--output",
        help="Output format: table, json, yaml, or state (a PlacementState document for "
        "`kubemoot place -f`).",
    ),
) -> None:
    """Probe Ollama-API endpoints and print their provider state."""
    import asyncio

    from kubemoot.clock import SystemClock
    from kubemoot.gateway.config import split_provider
    from kubemoot.providers.factory import ProviderClients
    from kubemoot.providers.prober import Prober
    texts = [*(endpoints or []), *providers]
    if not texts:
        raise InputError("name at least one endpoint: URL or NAME=URL (or --provider)",
                         field="endpoint")
    for text in texts:
        name, sep, _url = text.partition("=")
        if sep and not name.strip():
            raise InputError(f"{text!r} has an empty NAME before '='; give NAME=URL or just "
                             "URL", field="endpoint")
    # one parser with the gateway's --provider: ENDPOINT may carry the settings too
    split = [split_provider(text, flag="--provider" if text in providers else "endpoint")
             for text in texts]
    parsed = [(name, url) for name, url, _ in split]
    given = {name: values for name, _, values in split}
    names = [name for name, _ in parsed]
    if len(set(names)) != len(names):
        raise InputError("two endpoints share a provider name; give each NAME=URL",
                         field="endpoint")
    contexts = per_provider("--context-length", context_length, names, _count(1), None)
    slots = per_provider("--num-parallel", num_parallel, names, _count(1), 1)
    totals = per_provider("--vram-mib", vram_mib, names, _count(1), None)
    reserves = per_provider("--reserve-mib", reserve_mib, names, _count(0),
                            DEFAULTS.reserve_mib)
    exporters = _dcgm_urls(dcgm, names)
    for name, values in given.items():
        _take_given(name, values, (contexts, "contextLength"), (slots, "numParallel"),
                    (totals, "vramMiB"), (reserves, "reserveMiB"))

    async def run() -> list[ProviderState]:
        clock = SystemClock()
        # --timeout bounds each probe as a whole: no deployment timeout applies
        factory = ProviderClients(clock=clock)
        clients = [
            factory.client(name, url, context_length=contexts[name],
                           num_parallel=slots[name], reserve_mib=reserves[name],
                           total_vram_mib=totals[name], timeout=timeout, deadline=timeout,
                           max_retries=0, dcgm_url=exporters[name])
            for name, url in parsed
        ]
        try:
            return await Prober(clients, clock=clock).probe_all()
        finally:
            for client in clients:
                await client.close()

    states = asyncio.run(run())
    fmt = ProbeFormat.table if output is None else output
    if fmt is ProbeFormat.table:
        _print_table(states)
    elif fmt is ProbeFormat.state:
        emit_data(placement_state(states), _DataFormat.yaml)
    else:
        emit_data([s.model_dump(mode="json", by_alias=True) for s in states],
                  _DataFormat(fmt.value))


def _take_given(name: str, values: dict[str, int],
                *tables: tuple[dict[str, Any], str]) -> None:
    """A setting written in ``--provider`` wins for its provider over the plain flag."""
    for table, key in tables:
        if key in values:
            table[name] = values[key]


def per_provider(flag: str, values: Sequence[str], names: Sequence[str],
                 parse: Callable[[str], T], default: T) -> dict[str, T]:
    """``VALUE`` (every endpoint) and ``NAME=VALUE`` (one) flags → a value per provider.

    A named value wins over a plain one whatever their order; naming an endpoint that
    was not given, giving one endpoint two values, or a value ``parse`` refuses (it
    raises ValueError saying why) is bad input naming the flag.
    """
    shared: T = default
    named: dict[str, T] = {}
    plain_seen = False
    for text in values:
        name, sep, value = text.partition("=")
        try:
            if not sep:
                if plain_seen:
                    raise ValueError("a value for every endpoint was already given; name "
                                     "the endpoint as NAME=VALUE")
                plain_seen = True
                shared = parse(text)
                continue
            if name not in names:
                raise ValueError(f"no endpoint is named {name!r} "
                                 f"(endpoints: {', '.join(names)})")
            if name in named:
                raise ValueError(f"{name} was given a value already")
            named[name] = parse(value)
        except ValueError as error:
            raise InputError(f"{flag} {text}: {error}", field=flag) from None
    return {name: named.get(name, shared) for name in names}


def _count(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = text.strip()
        if not value.isdecimal() or int(value) < least:  # isdecimal: int() refuses "²"
            raise ValueError(f"expected a whole number ≥ {least}")
        return int(value)

    return parse


def _dcgm_urls(values: Sequence[str], names: Sequence[str]) -> dict[str, str | None]:
    """``--dcgm``: a plain URL needs a single endpoint; NAME=URL picks one of several."""
    found: dict[str, str | None] = dict.fromkeys(names)
    for text in values:
        name, sep, url = text.partition("=")
        if sep and name in names:
            target = name
        elif len(names) == 1 and (not sep or ":" in name or "/" in name):
            target, url = names[0], text  # a URL that itself holds '='
        elif sep and ":" not in name and "/" not in name:
            raise InputError(f"--dcgm {text}: no endpoint is named {name!r} "
                             f"(endpoints: {', '.join(names)})", field="--dcgm")
        else:
            raise InputError("--dcgm URL applies to one endpoint only; with several, give "
                             "NAME=URL", field="--dcgm")
        if found[target] is not None:
            raise InputError(f"--dcgm {text}: {target} was given an exporter already",
                             field="--dcgm")
        _check_dcgm_url(url)
        found[target] = url
    return found


def placement_state(states: Sequence[ProviderState]) -> dict[str, Any]:
    """The probed fleet as a ``PlacementState`` document for ``kubemoot place -f``.

    Every model a server lists is declared with its download size (``diskMiB``, what
    the runtime estimates an unloaded model's footprint from) and, once seen loaded,
    its observed footprint (``vramMiB``); loaded copies become residents. The document
    is checked against the model ``place`` loads it with, so what is printed loads.
    """
    from datetime import UTC, datetime

    from kubemoot.runtime.what_if import PlacementState

    probed = [s.last_probed_at for s in states if s.last_probed_at is not None]
    now = datetime.fromtimestamp(max(probed), UTC) if probed else datetime.now(UTC)
    disk: dict[str, int] = {}
    vram: dict[str, int] = {}
    for s in states:
        for model, mib in s.disk_sizes_mib.items():
            disk.setdefault(model, mib)
        for model, mib in s.loaded_model_footprints.items():
            vram.setdefault(model, mib)
    models = []
    for name in sorted(disk.keys() | vram.keys()):
        entry: dict[str, Any] = {"name": name}
        if name in vram:
            entry["vramMiB"] = vram[name]
        if name in disk:
            entry["diskMiB"] = disk[name]
        models.append(entry)
    providers = []
    for s in states:
        provider: dict[str, Any] = {"name": s.provider, "endpoint": s.endpoint,
                                    "ready": s.ready}
        if s.total_vram_mib is not None:
            provider["totalVramMiB"] = s.total_vram_mib
        provider["reserveMiB"] = s.reserve_mib
        provider["maxParallel"] = s.max_parallel
        if s.context_length is not None:
            provider["contextLength"] = s.context_length
        provider["residents"] = [
            {"model": m.name, "sizeMiB": m.size_mib,
             **({"contextLength": m.context_length} if m.context_length else {})}
            for m in s.loaded_models
        ]
        providers.append(provider)
    document = {
        "apiVersion": "kubemoot.ai/v1alpha1", "kind": "PlacementState",
        "metadata": {"name": "probe"},
        "now": now.isoformat().replace("+00:00", "Z"),
        "models": models, "providers": providers,
    }
    PlacementState.model_validate(document)
    return document


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
    return "?" if value is None else str(value)


def _print_table(states: list[ProviderState]) -> None:
    """One row per endpoint, laid out for an 80-column terminal.

    Provider and model names are never cut (:func:`add_name_column`); the endpoint goes
    under its provider's name and is the only text that folds when room runs out (JSON
    and YAML have everything whole). Loaded models go one per line, with their context
    only where it differs from the provider's.
    """
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    rows = []
    for s in states:
        loaded = "\n".join(
            f"{m.name} {m.size_mib}"
            + (f" ctx {m.context_length}" if m.context_length not in (None, s.context_length)
               else "")
            for m in s.loaded_models
        ) or "-"
        rows.append((s.provider, s.endpoint, "yes" if s.ready else "no",
                     f"{_mib(s.used_vram_mib)}/{_mib(s.total_vram_mib)}",
                     str(s.max_parallel), str(s.context_length or "?"), loaded))
    table = Table(title="Provider state (VRAM: used/total MiB; ctx: context per slot)",
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 1, 0, 0))
    # A provider's name stays whole up to NAME_ROOM characters; a longer one (typically
    # the host:port name of an endpoint given without NAME=) folds like the endpoint.
    table.add_column("provider, endpoint", overflow="fold",
                     min_width=min(max(len(r[0]) for r in rows), NAME_ROOM))
    add_name_column(table, "ready", (r[2] for r in rows))
    add_name_column(table, "VRAM", (r[3] for r in rows), justify="right")
    add_name_column(table, "slots", (r[4] for r in rows), justify="right")
    add_name_column(table, "ctx", (r[5] for r in rows), justify="right")
    add_name_column(table, "loaded models (MiB)", (r[6] for r in rows))
    for row in rows:
        style = "green" if row[2] == "yes" else "red"
        table.add_row(f"[bold]{escape(row[0])}[/]\n{escape(row[1])}",
                      f"[{style}]{row[2]}[/]", *row[3:])
    console.print(table)
    for s in states:
        if not s.ready:  # reasons are long; a column would crush the table
            console.print(f"[red]{s.provider} not ready:[/] {s.reason or 'unknown'}",
                          highlight=False)
