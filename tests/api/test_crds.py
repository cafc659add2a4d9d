"""CRD manifests: every kind, scope, status subresource, a structural schema that accepts
the spec's examples and rejects wrong types; and the `kubemoot crds` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubemoot.api import crd_manifests, validate_against_crd

FIXTURES = Path(__file__).parent / "fixtures"
KUBEMOOT = str(Path(sys.executable).with_name("kubemoot"))

SCOPES = {
    "Model": "Cluster",
    "ModelProvider": "Cluster",
    "MootArchetype": "Cluster",
    "KubemootConfig": "Cluster",
    "ModelClass": "Cluster",
    "Agent": "Namespaced",
    "CrewSchedulingPolicy": "Namespaced",
}


def by_kind() -> dict[str, dict[str, Any]]:
    return {crd["spec"]["names"]["kind"]: crd for crd in crd_manifests()}


def examples() -> list[dict[str, Any]]:
    docs = []
    for name in ("spec-examples.yaml", "quality-bias.yaml", "prod-bundle.yaml"):
        docs.extend(d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d)
    return [d for d in docs if d["apiVersion"] == "kubemoot.ai/v1alpha1"]


def walk(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found.extend(walk(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(walk(value))
    return found


@pytest.mark.parametrize(("kind", "scope"), SCOPES.items())
def test_every_kind_has_a_crd_with_its_scope(kind: str, scope: str) -> None:
    crd = by_kind()[kind]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = crd["spec"]
    assert spec["group"] == "kubemoot.ai"
    assert spec["scope"] == scope
    assert crd["metadata"]["name"] == f"{spec['names']['plural']}.kubemoot.ai"
    assert spec["names"]["shortNames"]
    version = spec["versions"][0]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"]


def test_only_the_seven_kinds() -> None:
    assert set(by_kind()) == set(SCOPES)


def test_printer_columns_named_by_the_issue() -> None:
    names = {
        kind: [column["name"] for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
        for kind, crd in by_kind().items()
    }
    assert names["Model"][:4] == ["Model", "Provider", "VRAM", "Ready"]
    assert {"Endpoint", "Ready", "VRAM Total", "Last Probed"} <= set(names["ModelProvider"])
    assert names["Agent"][:3] == ["Model", "Provider", "Scheduled"]


@pytest.mark.parametrize("kind", SCOPES)
def test_schemas_are_structural(kind: str) -> None:
    schema = by_kind()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["metadata"] == {"type": "object"}
    for node in walk(schema["properties"]["spec"]) + walk(schema["properties"]["status"]):
        if "type" in node or "x-kubernetes-preserve-unknown-fields" in node:
            assert "$ref" not in node and "anyOf" not in node and "allOf" not in node
            assert node.get("additionalProperties") is not False
            assert "title" not in node
    text = yaml.safe_dump(by_kind()[kind])
    assert "&id" not in text  # no YAML anchors: kubectl users read this


def test_free_form_fields_are_preserved() -> None:
    schema = by_kind()["Agent"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] is True
    phases = schema["properties"]["status"]["properties"]["scheduling"]["properties"]["phases"]
    assert phases["additionalProperties"]["x-kubernetes-preserve-unknown-fields"] is True


@pytest.mark.parametrize("doc", examples(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_schema_accepts_the_spec_examples(doc: dict[str, Any]) -> None:
    assert validate_against_crd(doc) == []


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("spec", "vramMib"), "lots", "spec.vramMib: expected integer, got str"),
        (("spec", "vramMib"), True, "spec.vramMib: expected integer, got bool"),
        (("spec", "vramMib"), -1, "spec.vramMib: must be at least 0"),
        (("spec", "license"), "MAYBE", "spec.license: unsupported value 'MAYBE'"),
        (("spec", "providerRef"), None, "spec.providerRef: must not be null"),
        (("spec", "vramMB"), 1, "spec.vramMB: unknown field"),
        (("metadata", "labels"), {"a": "b"}, None),
        (("status",), {"ready": "yes"}, "status.ready: expected boolean, got str"),
        (("status",), {"footprintMiB": 1.5}, "status.footprintMiB: expected integer"),
    ],
)
def test_schema_rejects_wrong_values(
    path: tuple[str, ...], value: Any, problem: str | None
) -> None:
    doc = next(d for d in examples() if d["kind"] == "Model")
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    problems = validate_against_crd(doc)
    if problem is None:
        assert problems == []
    else:
        assert any(p.startswith(problem) for p in problems), problems


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"apiVersion": "v1", "kind": "ConfigMap"}, "no CRD for kind"),
        ({"apiVersion": "kubemoot.ai/v2", "kind": "Agent", "metadata": {"name": "a"}},
         "apiVersion: expected kubemoot.ai/v1alpha1"),
        ({"apiVersion": "kubemoot.ai/v1alpha1", "kind": "Agent"}, "metadata.name: required"),
        ({"apiVersion": "kubemoot.ai/v1alpha1", "kind": "Model", "metadata": {"name": "m"}},
         "spec: required field is missing"),
        ({"apiVersion": "kubemoot.ai/v1alpha1", "kind": "ModelProvider", "metadata": {"name": "p"},
          "spec": {"endpoint": "e"}, "status": {"lastProbedAt": "yesterday"}},
         "status.lastProbedAt: expected an RFC 3339 date-time"),
        ({"apiVersion": "kubemoot.ai/v1alpha1", "kind": "CrewSchedulingPolicy",
          "metadata": {"name": "c"}, "spec": {"rules": [{"phase": "m", "prefer": [
              {"weight": 101, "selector": {}}]}]}},
         "spec.rules[0].prefer[0].weight: must be at most 100"),
    ],
)
def test_validator_reports(doc: dict[str, Any], problem: str) -> None:
    problems = validate_against_crd(doc)
    assert any(problem in p for p in problems), problems


def test_manifests_are_copies() -> None:
    first = crd_manifests()
    first[0]["spec"]["group"] = "changed"
    assert crd_manifests()[0]["spec"]["group"] == "kubemoot.ai"


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBEMOOT, *args], capture_output=True, text=True, input=stdin, timeout=120
    )


def test_kubemoot_crds_prints_yaml() -> None:
    result = run("crds")
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["CustomResourceDefinition"] * len(SCOPES)
    assert docs == crd_manifests()


def test_kubemoot_crds_json_is_a_list() -> None:
    result = run("crds", "-o", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "List"
    assert {item["spec"]["names"]["kind"] for item in data["items"]} == set(SCOPES)


def test_bad_input_through_the_cli_exits_2_without_traceback(tmp_path: Path) -> None:
    # `kubemoot decide` reads its file through the same InputError path as every command.
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: kubemoot.ai/v1alpha1\nkind: PlacementRequest\nspec: [\n")
    result = run("decide", "-f", str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert "bad.yaml" in result.stderr
