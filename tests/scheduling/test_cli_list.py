"""``kubemoot schedule`` reads what ``kubectl get agents -o yaml`` prints: a ``kind: List``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.api.cli_run import run_cli

ROOT = Path(__file__).resolve().parents[2]
HOMELAB = ROOT / "src" / "kubemoot" / "examples" / "homelab"
NOW = "2026-05-15T12:00:00Z"


def _as_kubectl_prints(agent: dict[str, Any], version: int) -> dict[str, Any]:
    """An Agent as the API server returns it: server-side metadata and a status."""
    meta = agent["metadata"]
    meta.update({
        "uid": f"0f8fad5b-d9cb-469f-a165-7086772895{version:02d}",
        "resourceVersion": str(1000 + version), "generation": 1,
        "creationTimestamp": "2026-05-15T11:00:00Z",
        "managedFields": [{"apiVersion": "kubemoot.ai/v1alpha1", "fieldsType": "FieldsV1",
                           "fieldsV1": {"f:spec": {}}, "manager": "kubectl",
                           "operation": "Update", "time": "2026-05-15T11:00:00Z"}],
    })
    return agent


def _split(tmp_path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The homelab bundle without its Agents (files) and the Agents (documents)."""
    others: list[str] = []
    agents: list[dict[str, Any]] = []
    for path in sorted(HOMELAB.glob("*.yaml")):
        kept = []
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Agent":
                agents.append(doc)
            elif doc:
                kept.append(doc)
        target = tmp_path / path.name
        target.write_text(yaml.safe_dump_all(kept))
        others.append(str(target))
    return others, agents


def test_a_kubectl_list_of_agents_is_scheduled_like_the_documents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    others, agents = _split(tmp_path)
    assert len(agents) >= 2
    listed = tmp_path / "agents-list.yaml"
    listed.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [_as_kubectl_prints(a, i) for i, a in enumerate(agents)],
    }))
    from_list = run_cli(["schedule", *[arg for f in others for arg in ("-f", f)], "-f", str(listed),
                         "--now", NOW, "-o", "json"], capsys)
    assert from_list.code == 0, from_list.stderr
    direct = run_cli(["schedule", "-f", str(HOMELAB), "--now", NOW, "-o", "json"], capsys)
    assert direct.code == 0, direct.stderr

    def bindings(out: str) -> dict[str, Any]:
        return {f"{a['namespace']}/{a['name']}": a["env"] for a in json.loads(out)["agents"]}

    assert bindings(from_list.stdout) == bindings(direct.stdout)
    assert len(bindings(from_list.stdout)) == len(agents)
    table = run_cli(["schedule", *[arg for f in others for arg in ("-f", f)], "-f", str(listed),
                     "--now", NOW], capsys)
    assert table.code == 0 and "no Agents" not in table.stdout


@pytest.mark.parametrize(("items", "field"), [
    ("not-a-list", "field items"),
    (["just a string"], "field items[0]"),
])
def test_a_malformed_list_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], items: Any, field: str
) -> None:
    listed = tmp_path / "list.yaml"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    done = run_cli(["schedule", "-f", str(listed), "--now", NOW], capsys)
    assert done.code == 2
    assert str(listed) in done.stderr and field in done.stderr and "Traceback" not in done.stderr
