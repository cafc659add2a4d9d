"""``kubemoot simulate``: run a scenario with every policy and compare them."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

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


@app.command("simulate")
def simulate_command(
    file: Path = typer.Option(..., "-f", "--file", metavar="FILE",
        help="Scenario YAML (kind SimulationScenario)."),
    policy: list[str] = typer.Option(
        ["all"], "--policy", "-p",
        help="Policy to run (repeatable): all, kubemoot, static, round-robin, least-busy, "
             "random, herd-like.",
    ),
    seed: int | None = typer.Option(None, "--seed", metavar="N",
        help="Workload seed (default: the file's)."),
    report: Path | None = typer.Option(
        None, "--report", metavar="DIR", help="Write report.json and PNG plots into this directory."
    ),
    scale_down: float | None = typer.Option(
        None, "--scale-down", metavar="SHARE",
        help="Keep this share (0–1] of every provider and crew group."
    ),
    duration: float | None = typer.Option(
        None, "--duration", metavar="SECONDS", help="Override the scenario's durationSeconds."
    ),
    output: OutputFormat | None = typer.Option(None, "-o", "--output", help=OUTPUT_OPTION_HELP),
) -> None:
    """Run the production runtime and the usual routers on one trace, in virtual time."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from kubemoot.api.bounds import MAX_SEED
    from kubemoot.sim.report import comparison_table, write_plots, write_report
    from kubemoot.sim.scenario import KIND, duration_problem, load_scenario
    from kubemoot.sim.simulation import POLICY_NAMES, simulate

    fmt = resolve_format(output)
    names: list[str] = []
    for entry in policy:
        for name in entry.split(","):
            name = name.strip()
            if name == "all":
                names.extend(POLICY_NAMES)
            elif name not in POLICY_NAMES:
                raise InputError(
                    f"unknown policy {name!r}; choose from all, {', '.join(POLICY_NAMES)}",
                    field="--policy",
                )
            else:
                names.append(name)
    names = list(dict.fromkeys(names))
    # Flags are checked before the run: a bad one must not cost a whole simulation.
    if scale_down is not None and not 0 < scale_down <= 1:
        raise InputError(f"must be in (0, 1], got {scale_down:g}", field="--scale-down")
    if duration is not None and (problem := duration_problem(duration)) is not None:
        raise InputError(problem, field="--duration")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise InputError(f"must be in [0, {MAX_SEED}], got {seed}", field="--seed")
    if report is not None:
        check_report_dir(report)
    if Path(file).is_dir():
        # read as a bundle it said "expected one scenario document, found 12"
        raise InputError(f"is a folder; give one {KIND} file", file=str(file))
    scenario = load_scenario(file)
    if scale_down is not None:
        scenario = scenario.scaled(scale_down)
    if duration is not None:
        scenario = scenario.with_duration(duration, field="--duration")

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total} policies"), TimeElapsedColumn(),
        console=err_console, transient=True,
    ) as progress:
        task = progress.add_task(f"simulating {scenario.name}", total=len(names))

        def advance(done: str) -> None:
            progress.update(task, advance=1, description=f"simulating {scenario.name}: {done}")

        result = simulate(scenario, policies=names, seed=seed, progress=advance)

    if report is not None:
        write_report(result, report)
        write_plots(result, report)
    if fmt is OutputFormat.table:
        console.print(comparison_table(result))
        if report is not None:
            console.print(f"report written to {report}/report.json with PNG plots")
    else:
        emit_data(result.to_json(), fmt)


def check_report_dir(directory: Path) -> None:
    """Prove ``directory`` can hold the report, leaving the file system as it was.

    Permission bits cannot answer this (root passes ``os.access`` everywhere, and
    ``/proc`` refuses new entries whatever the bits say), so the check does what the
    report will do: create the missing folders and a file, then removes what it made.
    """
    missing: list[Path] = []
    probe = directory
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        problem = (f"{directory} exists and is not a directory" if probe == directory
                   else f"{directory} cannot be created: {probe} is not a directory")
        raise InputError(problem, field="--report")
    created: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            created.append(folder)
        handle, name = tempfile.mkstemp(dir=directory, prefix=".kubemoot-report-check-")
        os.close(handle)
        os.unlink(name)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise InputError(f"cannot write a report into {directory}: {reason}",
                         field="--report") from None
    finally:
        for folder in reversed(created):
            with contextlib.suppress(OSError):  # someone put something there meanwhile
                folder.rmdir()
