"""``kubemoot schedule -f PATH…`` — an operator-side dry run over a bundle of resources.

Loads Models, ModelProviders, Agents, CrewSchedulingPolicies (and optionally
MootArchetypes and a KubemootConfig), runs one scheduling pass at ``--now`` and prints
every Agent's phases: a table for people, or the JSON/YAML document for scripts.
``--explain NAMESPACE/AGENT`` prints one Agent's decision records. Exit 0 whatever the
outcomes (UNSCHEDULABLE and DEFER are answers); 2 for bad input.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

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
    resolve_format,
)

if TYPE_CHECKING:
    from kubemoot.scheduling import AgentResult, PhaseResult, ScheduleResult

_OUTCOME_STYLE = {"PLACE": "bold green", "DEFER": "bold yellow", "UNSCHEDULABLE": "bold red"}
_VERDICT_STYLE = {"PASS": "green", "FAIL": "red", "UNKNOWN": "yellow", "STALE": "magenta"}


@app.command("schedule")
def schedule_command(
    files: list[str] = typer.Option(
        ...,
        "-f",
        "--filename",
        help="YAML file or folder of resources; repeat for more ('-' reads stdin).",
        show_default=False,
    ),
    now: str | None = typer.Option(
        None, "--now", metavar="TIME",
        help="Schedule as of this RFC 3339 time (default: the current time)."
    ),
    output: OutputFormat | None = typer.Option(None, "-o", "--output", help=OUTPUT_OPTION_HELP),
    explain: str | None = typer.Option(
        None, "--explain", metavar="NAMESPACE/AGENT",
        help="Print the decision records of one Agent: NAMESPACE/AGENT."
    ),
) -> None:
    """Dry-run the operator's scheduler: filter, score, spread and bind every Agent."""
    from kubemoot.api.loader import load_bundle
    from kubemoot.scheduling import schedule_bundle

    moment = _parse_now(now)
    target = None if explain is None else _parse_target(explain)
    bundle = load_bundle(files)
    result = schedule_bundle(bundle, now=moment)
    for warning in result.warnings:  # on stderr, so -o json stays a clean document
        err_console.print(f"warning: {warning}", highlight=False, markup=False)
    fmt = resolve_format(output)
    if target is not None:
        agent = result.agent(*target)
        if agent is None:
            raise InputError(f"no Agent {target[0]}/{target[1]} in the bundle", field="--explain")
        if fmt is OutputFormat.table:
            _print_explain(agent)
        else:
            emit_data(agent.to_dict(), fmt)
        return
    if fmt is OutputFormat.table:
        _print_table(result)
    else:
        emit_data(result.to_dict(), fmt)


def _parse_now(text: str | None) -> datetime:
    from datetime import UTC

    if text is None:
        return datetime.now(UTC)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(f'"{text}" is not an RFC 3339 time', field="--now") from None
    if moment.tzinfo is None:
        raise InputError(
            f'"{text}" has no time zone; write e.g. 2026-05-15T12:00:00Z', field="--now"
        )
    return moment


def _parse_target(text: str) -> tuple[str, str]:
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise InputError(f'"{text}" is not NAMESPACE/AGENT', field="--explain")
    return namespace, name


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _print_table(result: ScheduleResult) -> None:
    """One row per phase, laid out for an 80-column terminal.

    Names are never cut (see :func:`add_name_column`): an Agent is named once, on its
    first phase, under a heading row for its namespace (or, when the whole bundle shares
    one namespace, the title names it). Why a phase came out as it did is said under the
    table, in prose that wraps between words, and only where the row does not already
    say it all.
    """
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    namespaces = {agent.namespace for agent in result.agents}
    shared = next(iter(namespaces)) if len(namespaces) == 1 else None
    title = f"kubemoot schedule at {result.now.isoformat()}"
    if shared is not None:
        title += f", namespace {shared}"
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    current: str | None = None
    for agent in result.agents:
        name = agent.name
        if shared is None:  # several namespaces: a heading row for each, agents under it
            if agent.namespace != current:
                current = agent.namespace
                rows.append((f"{current}/", "", "", "", "", ""))
            name = f"  {agent.name}"
        for index, phase in enumerate(agent.phases.values()):
            rows.append((name if index == 0 else "", phase.phase, phase.model or "-",
                         phase.provider or "-", _score(phase.score), phase.outcome.value))
            plain = _plain_reason(phase)
            if phase.reason != plain:
                why = phase.reason.removeprefix(f"{plain}; ")
                who = agent.name if shared is not None else f"{agent.namespace}/{agent.name}"
                notes.append(f"[bold]{escape(who)} {escape(phase.phase)}[/]: "
                             f"{escape(why)}")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 2, 0, 0))
    for index, header in enumerate(("AGENT", "PHASE", "MODEL", "PROVIDER")):
        add_name_column(table, header, (row[index] for row in rows))
    add_name_column(table, "SCORE", (row[4] for row in rows), justify="right")
    add_name_column(table, "OUTCOME", (row[5] for row in rows))
    for row in rows:
        style = _OUTCOME_STYLE.get(row[5])
        table.add_row(*(escape(cell) for cell in row[:5]),
                      f"[{style}]{row[5]}[/]" if style else escape(row[5]))
    console.print(title, highlight=False)
    console.print(table)
    if not result.agents:
        console.print("no Agents in the bundle")
    for note in notes:
        console.print(note, highlight=False)
    for event in result.events:
        times = f" (x{event.count})" if event.count > 1 else ""
        console.print(
            f"[bold red]{event.type}[/] {event.reason} {event.regarding}: {event.message}{times}",
            highlight=False,
        )
    for policy in result.policies:
        for condition in policy.conditions:
            if condition.status != "True":
                console.print(
                    f"[bold yellow]{policy.policy.key}[/] {condition.type}=False "
                    f"({condition.reason}): {condition.message}",
                    highlight=False,
                )


def _plain_reason(phase: PhaseResult) -> str:
    """The reason a placed phase gives when the row's columns already say all of it.

    It mirrors the scheduler's wording; should that change, the table only prints a
    note it could have spared.
    """
    return f"{phase.model} on {phase.provider} scored {_score(phase.score)}"


def _print_explain(agent: AgentResult) -> None:
    policy = "none" if agent.policy is None else agent.policy.metadata.name
    console.print(
        f"[bold]Agent {agent.namespace}/{agent.name}[/] · policy {policy} · "
        f"capabilities {', '.join(agent.agent.spec.capabilities) or '-'}",
        highlight=False,
    )
    for condition in agent.conditions:
        console.print(
            f"  {condition.type}={condition.status} ({condition.reason}): {condition.message}",
            highlight=False,
        )
    for phase in agent.phases.values():
        _print_phase(phase)
    for name, value in agent.env.items():
        console.print(f"  env {name}={value}", highlight=False, soft_wrap=True)


def _phase_summary(phase: PhaseResult) -> str:
    """What the phase bound, said once: ``qwen3-32b (qwen3:32b) on rtx5090, score 270``.

    The Model resource's name and the engine's model identifier often look alike; both
    are shown because the Deployment's env carries the identifier, the status the name.
    """
    if phase.model is None:
        return phase.failure_message or phase.reason
    identifier = f" ({phase.model_id})" if phase.model_id and phase.model_id != phase.model \
        else ""
    where = f" on {phase.provider}" if phase.provider else ""
    return f"{phase.model}{identifier}{where}, score {_score(phase.score)}"


def _print_phase(phase: PhaseResult) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    record = phase.decision
    style = _OUTCOME_STYLE.get(record.outcome.value, "")
    console.print(
        f"\n[bold]phase {phase.phase}[/]: [{style}]{record.outcome.value}[/] "
        f"{escape(_phase_summary(phase))}",
        highlight=False,
    )
    console.print(f"  engine: {escape(record.reason)}", highlight=False)
    order = list(record.ranked) + [c for c in record.candidates if c not in record.scores]
    rows = []
    reasons: list[str] = []
    for cid in order:
        candidate = record.candidates[cid]
        terms = record.score_breakdown.get(cid, {})
        shown = "\n".join(  # one term a line: "ImageLocality 0×0.2" never breaks inside
            f"{name} {raw:g}×{record.weights.get(name, 1.0):g}" for name, raw in terms.items()
        )
        failed = [g for g in candidate.gates if not g.passed]
        # The table names each gate that did not pass; its reason, prose, goes below.
        problems = "\n".join(f"{g.gate} {g.result.value}" for g in failed)
        rows.append((("→ " if cid == record.chosen else "") + cid, candidate.standing.value,
                     _score(record.scores.get(cid)), shown or "-", problems or "all PASS"))
        reasons.extend(
            f"  {escape(cid)}: [{_VERDICT_STYLE[g.result.value]}]{g.gate} {g.result.value}[/]"
            f" {escape(g.reason)}" for g in failed)
    # SIMPLE_HEAD draws a one-space rule between columns: the only gap in this wide table.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)
    for index, header in enumerate(("MODEL", "STANDING", "SCORE", "TERMS", "NOT PASSED")):
        add_name_column(table, header, (r[index] for r in rows),
                        justify="right" if header == "SCORE" else "left")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    if order:  # the engine line above already says when there is nothing to rank
        console.print(table)
    for line in reasons:
        console.print(line, highlight=False)
    if record.recheck_triggers and record.outcome.value != "PLACE":
        console.print("  recheck when: " + "; ".join(record.recheck_triggers[:5]), highlight=False)
