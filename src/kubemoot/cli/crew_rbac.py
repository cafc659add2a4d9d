"""``kubemoot crew-rbac NAMESPACE…`` — the Role + RoleBinding a crew's namespace needs."""

from __future__ import annotations

import sys

import typer

from kubemoot.cli._common import app


@app.command("crew-rbac")
def crew_rbac_command(
    namespaces: list[str] = typer.Argument(..., help="The crews' namespaces."),
    operator_namespace: str = typer.Option(
        "kubemoot-system", "--operator-namespace", metavar="NAMESPACE",
        help="Where the operator runs."
    ),
    service_account: str = typer.Option(
        "kubemoot-operator", "--service-account", metavar="NAME",
        help="The operator's ServiceAccount."
    ),
) -> None:
    """Print the RBAC that lets the operator patch the Deployments of these namespaces."""
    from kubemoot.api.errors import InputError
    from kubemoot.api.labels import dns_label_problems
    from kubemoot.operator.rbac import crew_rbac_yaml

    for field, namespace in [*(("NAMESPACE", n) for n in namespaces),
                             ("--operator-namespace", operator_namespace)]:
        problems = dns_label_problems(namespace)
        if problems:
            raise InputError(f'"{namespace}" is not a namespace name: {"; ".join(problems)}',
                             field=field)
    sys.stdout.write(crew_rbac_yaml(namespaces, operator_namespace=operator_namespace,
                                    service_account=service_account))
