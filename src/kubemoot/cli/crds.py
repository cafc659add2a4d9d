"""``kubemoot crds`` — print the CustomResourceDefinitions, ready for ``kubectl apply -f -``."""

from __future__ import annotations

import sys

import typer

from kubemoot.cli._common import OUTPUT_OPTION_HELP, OutputFormat, app, console, emit_data


@app.command("crds")
def crds_command(
    output: OutputFormat | None = typer.Option(
        None,
        "-o",
        "--output",
        help=OUTPUT_OPTION_HELP + " Default: yaml (one document per CRD); table lists them.",
    ),
) -> None:
    """Print the CRDs of every Kubemoot kind (apiextensions.k8s.io/v1)."""
    import yaml
    from rich.table import Table

    from kubemoot.api.crds import crd_manifests

    manifests = crd_manifests()
    # This command's output is meant for kubectl, so YAML is its default, not a table.
    fmt = OutputFormat.yaml if output is None else output
    if fmt is OutputFormat.yaml:
        sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False, allow_unicode=True))
        sys.stdout.flush()
    elif fmt is OutputFormat.json:
        # A v1 List is what `kubectl apply -f` accepts as one JSON document.
        emit_data({"apiVersion": "v1", "kind": "List", "items": manifests}, fmt)
    else:
        table = Table("NAME", "KIND", "SCOPE", "SHORT NAMES")
        for crd in manifests:
            spec = crd["spec"]
            table.add_row(
                crd["metadata"]["name"],
                spec["names"]["kind"],
                spec["scope"],
                ", ".join(spec["names"]["shortNames"]),
            )
        console.print(table)
