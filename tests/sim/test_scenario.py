"""Scenario files: the shipped ones load; bad input names the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubemoot.api.bounds import (
    MAX_AGENTS,
    MAX_CONTEXT_TOKENS,
    MAX_COUNT,
    MAX_MIB,
    MAX_PARALLEL,
    MAX_RATE,
    MAX_SCORE,
    MAX_SECONDS,
    MAX_SEED,
)
from kubemoot.api.errors import InputError
from kubemoot.sim.scenario import (
    MAX_CV,
    MAX_EXPECTED_CALLS,
    MAX_PROVIDERS,
    MAX_SAMPLES,
    MAX_SIMULATED_SECONDS,
    MAX_TOTAL_AGENTS,
    load_scenario,
    parse_scenario,
)
from kubemoot.sim.workload import build_trace
from tests.api.cli_run import assert_refused, run_cli, with_value


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
        (lambda d: d["spec"]["providers"][0].update(reserveMiB=10**6), "spec.providers[0]"),
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


# ---------------------------------------------------------------------------- bounds

SHORT = {"spec.durationSeconds": 1}
# (field path, a value just inside, a value just outside, other fields the inside value
# needs so the whole workload stays inside the limits)
BOUNDS: list[tuple[str, Any, Any, dict[str, Any]]] = [
    ("spec.durationSeconds", MAX_SIMULATED_SECONDS, MAX_SIMULATED_SECONDS * 1.0001,
     {"spec.settings.sampleSeconds": 100}),
    ("spec.durationSeconds", 0.001, 0, {}),
    ("spec.seed", MAX_SEED, MAX_SEED + 1, {}),
    ("spec.seed", 0, -1, {}),
    ("spec.settings.loadRateMiBps", MAX_RATE, MAX_RATE * 1.0001, {}),
    ("spec.settings.unloadSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001, {}),
    ("spec.settings.keepAliveSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001, {}),
    ("spec.settings.gpuWaitLimitSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001, {}),
    ("spec.settings.sampleSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001, {}),
    ("spec.models[0].vramMiB", MAX_MIB, MAX_MIB + 1, {}),
    ("spec.providers[0].vramMiB", MAX_MIB, MAX_MIB + 1, {}),
    ("spec.providers[0].reserveMiB", MAX_MIB - 1, MAX_MIB + 1,
     {"spec.providers[0].vramMiB": MAX_MIB}),  # a card keeps some memory to offer
    ("spec.providers[0].maxParallel", MAX_PARALLEL, MAX_PARALLEL + 1, {}),
    ("spec.providers[0].loadRateMiBps", MAX_RATE, MAX_RATE * 1.0001, {}),
    ("spec.providers[0].unloadSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001, {}),
    ("spec.providers[0].contextLength", MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS + 1, {}),
    ("spec.providers[0].count", MAX_PROVIDERS, MAX_PROVIDERS + 1, {}),
    ("spec.crews[0].count", MAX_TOTAL_AGENTS // 3, MAX_TOTAL_AGENTS + 1, SHORT),
    ("spec.crews[0].agents", MAX_AGENTS, MAX_AGENTS + 1, {}),
    ("spec.crews[0].agentsPerDiscussion", 3, MAX_AGENTS + 1, {}),
    ("spec.crews[0].discussionsPerHour", MAX_RATE, MAX_RATE * 1.0001, SHORT),
    ("spec.crews[0].phases[0].steps", MAX_COUNT, MAX_COUNT + 1, SHORT),
    ("spec.crews[0].phases[0].latency.meanSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001, {}),
    ("spec.crews[0].phases[0].latency.cv", MAX_CV, MAX_CV * 1.0001, {}),
    ("spec.crews[0].phases[0].fanOut.width", MAX_PARALLEL, MAX_PARALLEL + 1, {}),
    ("spec.crews[0].phases[0].fanOut.probability", 1, 1.01, {}),
    ("spec.crews[0].phases[0].promptTokens", MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS + 1, {}),
    ("spec.crews[0].phases[0].thinkSeconds", MAX_SECONDS, MAX_SECONDS * 1.0001, {}),
    ("spec.crews[0].phases[0].candidates[0].score", MAX_SCORE, MAX_SCORE * 1.0001, {}),
]


def _with(scenarios: Path, values: dict[str, Any]) -> dict[str, Any]:
    data = _base(scenarios)
    for path, value in values.items():
        data = with_value(data, path, value)
    return data


@pytest.mark.parametrize(("path", "inside", "outside", "extra"), BOUNDS,
                         ids=[f"{p}={o}" for p, _, o, _ in BOUNDS])
def test_each_scenario_number_has_a_bound(
    scenarios: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str,
    inside: Any, outside: Any, extra: dict[str, Any],
) -> None:
    parse_scenario(_with(scenarios, {**extra, path: inside}), file="s.yaml")  # no error
    file = tmp_path / "s.yaml"
    file.write_text(yaml.safe_dump(_with(scenarios, {**extra, path: outside})))
    done = run_cli(["simulate", "-f", str(file)], capsys)
    assert_refused(done, "s.yaml", "SimulationScenario/tiny", f"field {path}")


@pytest.mark.parametrize("path", ["spec.durationSeconds", "spec.settings.sampleSeconds",
                                  "spec.crews[0].discussionsPerHour",
                                  "spec.crews[0].phases[0].latency.cv",
                                  "spec.crews[0].phases[0].candidates[0].score"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1e400"])
def test_scenario_infinity_and_nan_are_refused(
    scenarios: Path, path: str, value: Any
) -> None:
    with pytest.raises(InputError) as caught:
        parse_scenario(_with(scenarios, {path: value}), file="s.yaml")
    assert caught.value.field == path


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"spec.providers[0].count": MAX_PROVIDERS // 2 + 1,
          "spec.providers[1]": {"name": "b", "vramMiB": 2048, "count": MAX_PROVIDERS // 2}},
         f"the limit is {MAX_PROVIDERS:,}"),
        ({"spec.crews[0].count": 100, "spec.crews[0].agents": MAX_AGENTS},
         f"the limit is {MAX_TOTAL_AGENTS:,}"),
        ({"spec.durationSeconds": 30 * 24 * 3600, "spec.settings.sampleSeconds": 100,
          "spec.crews[0].discussionsPerHour": 3600},
         f"calls in durationSeconds 2.592e+06; the limit is {MAX_EXPECTED_CALLS:,}"),
        ({"spec.durationSeconds": MAX_SAMPLES + 1, "spec.settings.sampleSeconds": 1},
         f"VRAM samples; the limit is {MAX_SAMPLES:,}"),
    ],
)
def test_the_workload_as_a_whole_is_bounded(
    scenarios: Path, values: dict[str, Any], needle: str
) -> None:
    data = _base(scenarios)
    for path, value in values.items():
        if path.endswith("[1]"):
            data["spec"]["providers"].append(value)
        else:
            data = with_value(data, path, value)
    with pytest.raises(InputError) as caught:
        parse_scenario(data, file="s.yaml")
    assert caught.value.field == "spec"
    assert needle in caught.value.message


def test_the_shipped_scale_scenario_sits_well_inside_the_limits(scenarios: Path) -> None:
    spec = load_scenario(scenarios / "scale.yaml").spec
    assert spec.workload_problem() is None
    assert spec.expected_calls() * 10 < MAX_EXPECTED_CALLS


def test_a_longer_duration_is_checked_against_the_workload_limit(scenarios: Path) -> None:
    scenario = load_scenario(scenarios / "scale.yaml")
    with pytest.raises(InputError) as caught:
        scenario.with_duration(MAX_SIMULATED_SECONDS, field="--duration")
    assert caught.value.field == "--duration"
    assert "calls in durationSeconds" in caught.value.message


def test_a_misspelt_required_key_is_named_with_the_right_one(scenarios: Path) -> None:
    data = _base(scenarios)
    data["spec"]["durationSecond"] = data["spec"].pop("durationSeconds")
    with pytest.raises(InputError) as caught:
        parse_scenario(data, file="s.yaml")
    assert caught.value.field == "spec.durationSecond"
    assert caught.value.message.startswith('unknown field; did you mean "durationSeconds"?')
    assert "spec.durationSeconds: required field is missing" in caught.value.message
