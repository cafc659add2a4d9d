"""A small RBAC evaluator: which requests the operator's ServiceAccount may make.

It reads the Roles, ClusterRoles and their bindings from manifests, as the API server's
RBAC authorizer would, for the one subject the operator runs as. Only what our manifests
use is modelled: exact verbs, resources, API groups and namespaces (no wildcards, no
resourceNames, no aggregation); a test asserts the manifests use nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubemoot.operator.rbac import OPERATOR_NAMESPACE, SERVICE_ACCOUNT


@dataclass(frozen=True)
class Grant:
    """One rule, in force cluster-wide (``namespace`` None) or in one namespace."""

    namespace: str | None
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]


def grants(docs: Iterable[Mapping[str, Any]], *, namespace: str = OPERATOR_NAMESPACE,
           account: str = SERVICE_ACCOUNT) -> list[Grant]:
    """The rules bound to ServiceAccount ``namespace/account`` by ``docs``."""
    items = list(docs)
    roles: dict[tuple[str, str | None, str], list[Mapping[str, Any]]] = {}
    for doc in items:
        if doc.get("kind") in ("Role", "ClusterRole"):
            meta = doc["metadata"]
            scope = meta.get("namespace") if doc["kind"] == "Role" else None
            roles[(doc["kind"], scope, meta["name"])] = doc.get("rules") or []
    found: list[Grant] = []
    for doc in items:
        if doc.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   and s.get("namespace") == namespace for s in doc.get("subjects") or []):
            continue
        where = doc["metadata"].get("namespace") if doc["kind"] == "RoleBinding" else None
        ref = doc["roleRef"]
        role_scope = where if ref["kind"] == "Role" else None
        for rule in roles.get((ref["kind"], role_scope, ref["name"]), []):
            found.append(Grant(where, frozenset(rule.get("apiGroups") or []),
                               frozenset(rule.get("resources") or []),
                               frozenset(rule.get("verbs") or [])))
    return found


def allowed(granted: Iterable[Grant], *, verb: str, group: str, resource: str,
            namespace: str | None) -> bool:
    """Whether some grant allows ``verb`` on ``group/resource`` in ``namespace``."""
    return any(
        (g.namespace is None or g.namespace == namespace)
        and group in g.groups and resource in g.resources and verb in g.verbs
        for g in granted
    )
