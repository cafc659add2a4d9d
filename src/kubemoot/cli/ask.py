"""``kubemoot ask --crew NAMESPACE/CREW "question"`` — ask a crew running on a cluster.

The question goes over NATS to the crew's coordinator (a ``kubemoot agent`` with the
coordinator role), which runs the discussion with its members' processes. The answer
comes back with every model call's attribution: which agent, which phase, the provider
and model the call really ran on, how it was placed (warm, queue, loading, cold-load,
unload) and what was evicted for it. Exit status 0 when the crew answered, 1 when it
could not (no GPU, no member, a failed synthesis: the message says which).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import (
    OUTPUT_OPTION_HELP,
    OutputFormat,
    app,
    console,
    emit_data,
    err_console,
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
    from kubemoot.agent.remote import CrewRef
    from kubemoot.settings import NatsSettings, Settings

MAX_QUESTION_CHARS = 100_000  # a question, not a document


@app.command("ask")
@nats_options(url_from_env=True, reconnect=False)
def ask_command(
    question: str = typer.Argument(..., metavar="QUESTION", help="What to ask the crew."),
    crew: str = typer.Option(..., "--crew", metavar="NAMESPACE/CREW",
                             help="The crew: its namespace and kubemoot.ai/crew label."),
    timeout: float | None = typer.Option(
        None, "--timeout", min=1.0, metavar="SECONDS",
        help="How long to wait for the answer (default: the discussion's deadline, "
        "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS, plus the crew's grace and a margin)."),
    output: OutputFormat | None = typer.Option(None, "-o", "--output", help=OUTPUT_OPTION_HELP),
    nats: NatsFlags = NO_NATS_FLAGS,
) -> None:
    """Ask a crew a question; print its answer and where every call ran."""
    from kubemoot.agent.remote import CrewRef
    from kubemoot.settings import Settings

    fmt = resolve_format(output)
    try:
        ref = CrewRef.parse(crew)
    except ValueError as error:
        raise InputError(str(error), field="--crew") from None
    text = question.strip()
    if not text:
        raise InputError("is empty", field="QUESTION")
    if len(text) > MAX_QUESTION_CHARS:
        raise InputError(f"has {len(text)} characters; at most {MAX_QUESTION_CHARS}",
                         field="QUESTION")
    if not nats.names_servers():
        raise InputError("a crew is asked over NATS: give --nats nats://HOST:PORT (or set "
                         "KUBEMOOT_NATS_URL)", field="--nats")
    settings = resolve_nats(nats, use_nats=True)
    assert settings is not None
    tunables = Settings.from_env()
    wait = timeout if timeout is not None else (
        tunables.runtime.gpu_wait_limit_seconds + tunables.crew.silence_seconds
        + tunables.crew.roll_call_seconds + 30.0)
    import asyncio

    reply = asyncio.run(_ask(ref, text, settings, tunables, wait))
    if "error" in reply:
        err_console.print(f"error: the crew's coordinator says: {reply['error']}",
                          highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if fmt is OutputFormat.table:
        _print(reply)
    else:
        emit_data(reply, fmt)
    if not reply.get("answered"):
        raise typer.Exit(1)


async def _ask(ref: CrewRef, question: str, nats: NatsSettings, tunables: Settings,
               wait: float) -> dict[str, Any]:
    from kubemoot.store.bus import BusError, NoResponders
    from kubemoot.store.nats import NatsKV
    from kubemoot.store.natsbus import NatsBus

    kv = await open_shared_store(nats, connect_wait=tunables.process.connect_wait_seconds)
    assert isinstance(kv, NatsKV)
    where = mask_servers(nats.servers)
    try:
        err_console.print(f"asking crew {ref} …", highlight=False, markup=False)
        data = json.dumps({"question": question}).encode("utf-8")
        try:
            raw = await NatsBus(kv).request(ref.ask_subject(), data, timeout=wait)
        except NoResponders:
            raise InputError(f"no coordinator of crew {ref} listens on NATS at {where}; is "
                             "its `kubemoot agent --role coordinator` running?",
                             field="--crew") from None
        except BusError as error:
            raise RuntimeError(f"no answer from crew {ref}: {error}") from None
    finally:
        await kv.close()
    body = json.loads(raw.decode("utf-8"))
    if not isinstance(body, dict):
        raise RuntimeError(f"crew {ref} answered something that is not an answer")
    return body


def _print(reply: dict[str, Any]) -> None:
    from rich.table import Table

    console.print(reply.get("answer", ""), highlight=False, markup=False, soft_wrap=True)
    console.print()
    members = reply.get("members") or []
    console.print(f"crew {reply.get('crew')}: {reply.get('settlement')}; "
                  f"{len(members)} member(s) answered the roll call, "
                  f"{len(reply.get('selected') or [])} selected", highlight=False,
                  markup=False)
    table = Table(title="calls", title_justify="left")
    for column in ("agent", "phase", "provider", "model", "action", "evicted", "waited s",
                   "seconds", "ok"):
        table.add_column(column)
    for call in reply.get("calls") or []:
        table.add_row(
            str(call.get("agent")), str(call.get("phase")), str(call.get("provider") or "-"),
            str(call.get("model") or "-"), str(call.get("action")),
            ", ".join(call.get("evicted") or []) or "-",
            f"{float(call.get('waitedSeconds') or 0.0):.2f}",
            f"{float(call.get('seconds') or 0.0):.2f}", "yes" if call.get("ok") else "no",
        )
    console.print(table)
    failures = [s for s in reply.get("signals") or [] if s.get("type") == "failure"]
    for signal in failures:
        meta = signal.get("metadata") or {}
        err_console.print(f"{signal.get('agent')}: failure "
                          f"({meta.get('failureType')}: {meta.get('lastError')})",
                          highlight=False, markup=False, soft_wrap=True)
