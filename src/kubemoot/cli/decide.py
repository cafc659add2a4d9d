"""``kubemoot decide -f REQUEST.yaml`` — a capability-aware placement decision.

Reads one ``PlacementRequest``, runs the typed hard gates and the versioned scoring
policy, and prints the decision record: a table that explains it to a person, or the
``PlacementDecision`` document as JSON/YAML. Exit 0 for PLACE, DEFER and
UNSCHEDULABLE alike (each is a valid answer); 2 for bad input.
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
    from kubemoot.capability import PlacementRequest
    from kubemoot.gates import DecisionRecord

_VERDICT_STYLE = {
    "PASS": "bold green",
    "FAIL": "bold red",
    "UNKNOWN": "bold yellow",
    "STALE": "bold magenta",
}
_OUTCOME_STYLE = {"PLACE": "bold green", "DEFER": "bold yellow", "UNSCHEDULABLE": "bold red"}
_STANDING_STYLE = {"feasible": "bold green", "uncertain": "bold yellow", "hardFailed": "bold red"}
# Short headers keep seven gate columns inside an 80-column terminal.
_HEADERS = {"accelerator": "accel.", "freshness": "fresh"}


@app.command("decide")
def decide_command(
    file: Path = typer.Option(
        ...,
        "-f",
        "--file",
        metavar="FILE",
        help="PlacementRequest YAML file ('-' reads stdin).",
        show_default=False,
    ),
    output: OutputFormat | None = typer.Option(None, "-o", "--output", help=OUTPUT_OPTION_HELP),
) -> None:
    """Decide where a workload may run from typed capability evidence."""
    from datetime import UTC, datetime

    from kubemoot.capability import decide, decision_document

    request = _load(file)
    # A request without spec.now is decided at the current time.
    now = datetime.now(UTC)
    record = decide(request, now=now)
    document = decision_document(request, record, now=now)
    fmt = resolve_format(output)
    if fmt is OutputFormat.table:
        _print_table(request, record, document)
    else:
        emit_data(document, fmt)


def _load(file: Path) -> PlacementRequest:
    """Read the file with the shared loader (its errors name file and document)."""
    from kubemoot.api.loader import iter_documents
    from kubemoot.capability import parse_request
    from kubemoot.capability.model import KIND

    if file.is_dir():
        raise InputError(f"is a folder; give one {KIND} file", file=str(file))
    documents = list(iter_documents([file]))
    if len(documents) != 1:
        raise InputError(
            f"expected exactly one {KIND} document, found {len(documents)}", file=str(file)
        )
    (document,) = documents
    return parse_request(document.data, file=document.file, document=document.index)


def _print_table(
    request: PlacementRequest, record: DecisionRecord, document: dict[str, Any]
) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from kubemoot.capability import GATE_FIELDS

    gate_names = list(GATE_FIELDS)
    outcome = record.outcome.value
    title = Text.assemble(
        f"{request.metadata.name or 'PlacementRequest'} · workload {record.subject} · ",
        (outcome, _OUTCOME_STYLE[outcome]),
    )
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=True,
    )
    table.add_column("node", no_wrap=True)
    for name in gate_names:
        table.add_column(_HEADERS.get(name, name), justify="center", no_wrap=True)
    table.add_column("score", justify="right", no_wrap=True)
    for cid, candidate in record.candidates.items():
        cells: list[Text | str] = [Text(cid, style=_STANDING_STYLE[candidate.standing.value])]
        for name in gate_names:
            result = candidate.gate(name)
            if result is None:
                cells.append(Text("–", style="dim"))
            else:
                verdict = result.result.value
                cells.append(Text(verdict, style=_VERDICT_STYLE[verdict]))
        score = record.scores.get(cid)
        cells.append("—" if score is None else f"{score:.2f}")
        table.add_row(*cells)
    console.print(table)
    console.print(
        " node: [green]feasible[/] · [yellow]uncertain[/] · [red]hard-failed[/]"
        " (only feasible nodes are scored)"
    )

    console.print("[bold]Why[/]")
    for cid, candidate in record.candidates.items():
        problems = [g for g in candidate.gates if not g.passed]
        if not problems:
            console.print(f"  [bold]{cid}[/] passes every gate", highlight=False)
            continue
        freshness = candidate.gate("freshness")
        if freshness is not None and freshness.result.value == "STALE":
            # One line for a stale node: its age, and what the old evidence said.
            said = [
                f"{g.gate} {g.evidence.get('verdictIfFresh')}"
                for g in problems
                if g.gate != "freshness" and g.result.value == "STALE"
            ]
            console.print(
                f"  [bold]{cid}[/] [{_VERDICT_STYLE['STALE']}]STALE[/]: {freshness.reason}; "
                f"when fresh it said {', '.join(said) or 'nothing decisive'}",
                highlight=False,
            )
            problems = [g for g in problems if g.result.value != "STALE"]
        for result in problems:
            verdict = result.result.value
            console.print(
                f"  [bold]{cid}[/] {result.gate} [{_VERDICT_STYLE[verdict]}]{verdict}[/]: "
                f"{result.reason}",
                highlight=False,
            )
    if record.ranked:
        console.print(f"[bold]Scores[/] ({record.scoring_policy_version}, feasible nodes only)")
        weights = ", ".join(f"{n}×{w:g}" for n, w in record.weights.items())
        console.print(f"  weights: {weights}", highlight=False)
        for cid in record.ranked:
            parts = ", ".join(f"{n} {v:.1f}" for n, v in record.score_breakdown[cid].items())
            console.print(f"  {cid}: {record.scores[cid]:.2f}  ({parts})", highlight=False)
    console.print(
        f"[bold]Outcome[/]: [{_OUTCOME_STYLE[outcome]}]{outcome}[/]"
        + (f" on [bold]{record.chosen}[/]" if record.chosen else ""),
        highlight=False,
    )
    console.print(f"[bold]Reason[/]: {record.reason}", highlight=False)
    if record.recheck_triggers:
        console.print("[bold]Recheck when[/]")
        for trigger in record.recheck_triggers:
            console.print(f"  • {trigger}", highlight=False)
    console.print(
        f"[dim]{record.scheduler_version} · record {record.record_version} · "
        f"decided at {document['now']}[/]",
        highlight=False,
    )
