"""``kubemoot place -f STATE.yaml --model M`` — one per-call placement, explained.

Runs the runtime's own CallPlanner on a ``PlacementState`` snapshot loaded into the
embedded store: what the call would do (warm, loading, cold-load, queue, unload, wait,
refuse), where, which models it would evict, and what every option costs in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from collections.abc import Mapping

    from kubemoot.runtime.placement import CallPlacement, CandidateModel
    from kubemoot.runtime.what_if import PlacementState

_ACTION_TEXT = {
    "warm": "runs now on the warm copy of {model} on {provider}",
    "loading": "joins the copy of {model} another call is loading on {provider}",
    "cold-load": "loads {model} onto free memory on {provider}",
    "unload": "unloads {evicted} from {provider}, then loads {model} there",
    "queue": "queues for a slot on {provider}'s copy of {model}; it places again on the "
    "next capacity change",
    "wait": "waits for GPU capacity (reason: {reason})",
    "refuse": "cannot run: {reason}; the agent stands aside at once",
}


@app.command("place")
def place_command(
    file: Path = typer.Option(
        ..., "-f", "--file", metavar="FILE", help="PlacementState YAML file.", show_default=False
    ),
    model: str = typer.Option(..., "--model", metavar="MODEL",
        help="The preferred model of the call."),
    candidates: str | None = typer.Option(
        None, "--candidates", metavar="JSON",
        help='Candidate list as JSON, preferred first: [{"model": "qwen3:32b", "score": 70}].',
    ),
    prompt_tokens: int | None = typer.Option(
        None, "--prompt-tokens", metavar="TOKENS",
        help="Prompt size in tokens (for the context filter)."
    ),
    output: OutputFormat | None = typer.Option(None, "-o", "--output", help=OUTPUT_OPTION_HELP),
) -> None:
    """Decide where one inference call would run against a fleet snapshot."""
    import asyncio

    from kubemoot.api.bounds import MAX_CONTEXT_TOKENS
    from kubemoot.runtime.what_if import decide, load_state, parse_candidates

    if prompt_tokens is not None and not 0 <= prompt_tokens <= MAX_CONTEXT_TOKENS:
        raise InputError(
            f"must be in [0, {MAX_CONTEXT_TOKENS}], got {prompt_tokens}", field="--prompt-tokens"
        )
    if not model:
        raise InputError("must name a model", field="--model")
    state = load_state(file)
    wanted = parse_candidates(candidates, model)
    _check_known(state, wanted, file=file, preferred=model)
    placement = asyncio.run(decide(state, wanted, prompt_tokens=prompt_tokens))
    fmt = resolve_format(output)
    if fmt is OutputFormat.table:
        _print_table(placement)
    else:
        data = placement.to_dict()
        for internal in ("ticketId", "waitedSeconds"):
            data.pop(internal, None)  # meaningless for a what-if on a throw-away store
        emit_data(data, fmt)


def _known_models(state: PlacementState) -> set[str]:
    """Models the snapshot gives a size or a copy: declared, resident, or named by a ticket."""
    known = {m.name for m in state.models}
    for provider in state.providers:
        known.update(r.model for r in provider.residents)
        for ticket in provider.tickets:
            known.add(ticket.model)
            known.update(ticket.evicts)
    return known


def _check_known(
    state: PlacementState, wanted: list[CandidateModel], *, file: Path, preferred: str
) -> None:
    """Refuse a model the snapshot knows nothing about.

    Without a declaration, a resident copy or a ticket, occupancy(M) has no source, so
    the planner could only answer "wait" for ever; a typo in ``--model`` would pass as a
    busy fleet. Saying so is the honest answer.
    """
    known = _known_models(state)
    for candidate in wanted:
        if candidate.model in known:
            continue
        flag = "--model" if candidate.model == preferred else "--candidates"
        raise InputError(
            f"{candidate.model!r} is not declared in {file} and no provider holds it",
            field=flag,
        )


def _print_table(placement: CallPlacement) -> None:
    from rich.table import Table

    action = placement.action.value
    text = _ACTION_TEXT.get(action, action).format(
        model=placement.model, provider=placement.provider, reason=placement.reason,
        evicted=", ".join(placement.evicted) or "nothing",
    )
    console.print(f"[bold]{action}[/]: the call {text}.", highlight=False)
    if placement.decision is not None:
        console.print(f"why: {placement.decision.reason}", highlight=False)
    # A heading line rather than the table's title: rich wraps a title to the table's
    # width, which cut this sentence in two for a table of three short columns.
    table = Table()
    for column in ("", "kind", "provider", "model", "seconds", "victims"):
        table.add_column(column, justify="right" if column == "seconds" else "left")
    chosen = (placement.provider, placement.model)
    for option in placement.options:
        mark = "→" if (option.provider, option.model) == chosen else ""
        table.add_row(
            mark, option.kind.value, option.provider, option.model, f"{option.seconds:.3f}",
            ", ".join(option.victims),
        )
    if placement.options:
        console.print(
            "options, in expected seconds before the call can start (lowest wins):",
            highlight=False,
        )
        console.print(table)
    else:
        console.print("no option: no provider can take the call now.")
    if placement.decision is not None:
        failed = [
            f"{cid}: " + "; ".join(_with_evidence(g.reason, g.evidence) for g in cand.failures)
            for cid, cand in placement.decision.candidates.items()
            if cand.failures
        ]
        if failed:
            console.print("filtered out:", highlight=False)
            for line in failed:
                console.print(f"  {line}", highlight=False)


def _with_evidence(reason: str, evidence: Mapping[str, Any]) -> str:
    """A gate's reason with the numbers it rests on ("40960 > 31744" is what tells a
    reader how far off the model is), as the JSON output's ``evidence`` has them."""
    shown = [f"{key} {value}" for key, value in evidence.items()
             if isinstance(value, int | float | str) and not isinstance(value, bool)
             and str(value) not in reason]  # a figure the reason already says
    return f"{reason} ({', '.join(shown)})" if shown else reason
