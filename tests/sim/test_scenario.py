"""Scenario files: the shipped ones load; bad input names the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubemoot.api.errors import InputError
from kubemoot.sim.scenario import load_scenario, parse_scenario
from kubemoot.sim.workload import build_trace


@pytest.mark.parametrize("name", ["tiny", "homelab", "fleet-16", "scale"])
def test_shipped_scenarios_load(scenarios: Path, name: str) -> None:
    assert load_scenario(scenarios / f"{name}.yaml").name == name


def test_scale_and_fleet_have_the_promised_shape(scenarios: Path) -> None:
    scale = load_scenario(scenarios / "scale.yaml").spec
    assert sum(p.count for p in scale.providers) == 1000
    assert sum(c.count * c.agents for c in scale.crews) == 10_000
    fleet = load_scenario(scenarios / "fleet-16.yaml").spec
    assert sum(p.count for p in fleet.providers) == 16
    assert {p.vram_mib for p in fleet.providers} == {24576, 49152, 81920}
    assert len(fleet.models) == 12
    assert sum(c.count * c.agents for c in fleet.crews) == 200


def _base(scenarios: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((scenarios / "tiny.yaml").read_text())
    return data


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(kind="Nope"), "kind"),
        (lambda d: d["spec"]["providers"][0].update(vramMiB=-1), "spec.providers[0].vramMiB"),
        (lambda d: d["spec"]["providers"][0].update(colour="red"), "spec.providers[0].colour"),
        (lambda d: d["spec"].pop("durationSeconds"), "spec.durationSeconds"),
        (lambda d: d["spec"]["crews"][0]["phases"][0]["latency"].update(meanSeconds=0),
         "spec.crews[0].phases[0].latency.meanSeconds"),
        (lambda d: d["spec"]["crews"][0].update(agentsPerDiscussion=9), "spec.crews[0]"),
        (lambda d: d["spec"]["crews"][0]["phases"][0]["candidates"][0].update(model="x"),
         "spec"),
    ],
)
def test_bad_input_is_an_input_error_naming_the_field(
    scenarios: Path, mutate: Any, field: str
) -> None:
    data = _base(scenarios)
    mutate(data)
    with pytest.raises(InputError) as caught:
        parse_scenario(data, file="s.yaml")
    assert caught.value.field == field
    assert caught.value.file == "s.yaml"


@pytest.mark.parametrize(
    ("text", "message"),
    [("a: [", "YAML syntax error at line 1"), ("", "expected one scenario document")],
)
def test_unreadable_files_are_input_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_scenario(path)


def test_a_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_scenario(tmp_path / "absent.yaml")


def test_the_trace_is_a_function_of_the_seed(scenarios: Path) -> None:
    scenario = load_scenario(scenarios / "homelab.yaml")
    assert build_trace(scenario, seed=5) == build_trace(scenario, seed=5)
    assert build_trace(scenario, seed=5) != build_trace(scenario, seed=6)


def test_fan_out_bursts_issue_several_calls_in_one_step(scenarios: Path) -> None:
    trace = build_trace(load_scenario(scenarios / "homelab.yaml"))
    widths = {len(s.calls) for d in trace.discussions for t in d.turns for s in t.steps}
    assert widths == {1, 2, 3}
    assert trace.call_count == len(trace.calls())
