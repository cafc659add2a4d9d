"""Golden tests: the example bundles schedule exactly as the checked-in JSON says.

Regenerate after an intended change with ``KUBEMOOT_UPDATE_GOLDEN=1 pytest tests/scheduling``
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubemoot.api.loader import load_bundle
from kubemoot.scheduling import schedule_bundle

from .conftest import NOW

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")
BUNDLES = {
    "homelab": ROOT / "examples" / "homelab",
    "dev": ROOT / "examples" / "bundles" / "dev",
    "prod": ROOT / "examples" / "bundles" / "prod",
}


@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_example_bundle_matches_golden(name: str) -> None:
    document = schedule_bundle(load_bundle([BUNDLES[name]]), now=NOW).to_dict()
    rendered = json.dumps(document, indent=2, sort_keys=True) + "\n"
    path = GOLDEN / f"{name}.json"
    if os.environ.get("KUBEMOOT_UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert json.loads(rendered) == json.loads(path.read_text())


def test_homelab_distributes_like_the_spec_example() -> None:
    result = schedule_bundle(load_bundle([BUNDLES["homelab"]]), now=NOW)
    mulling = {a.name: a.phases["mulling"].model_id for a in result.agents}
    # The synthesizer declared reasoning and holds the large model; toolers stay small.
    assert mulling == {
        "coordinator": "qwen3:32b",
        "kubectl-agent": "qwen3:8b",
        "logs-agent": "qwen3:8b",
        "prometheus-agent": "qwen3:8b",
    }
    assert {a.phases["mulling"].provider for a in result.agents} == {"rtx5090"}
    assert {a.phases["triage"].provider for a in result.agents} == {"rtx4090"}


def test_dev_and_prod_share_byte_identical_agents_and_policy() -> None:
    for file in ("agents.yaml", "policy.yaml"):
        dev = (BUNDLES["dev"] / file).read_bytes()
        assert dev == (BUNDLES["prod"] / file).read_bytes(), file


def test_the_same_crew_schedules_on_both_clusters() -> None:
    for name in ("dev", "prod"):
        result = schedule_bundle(load_bundle([BUNDLES[name]]), now=NOW)
        outcomes = {p.outcome.value for a in result.agents for p in a.phases.values()}
        assert outcomes == {"PLACE"}, name
