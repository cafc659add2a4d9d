"""The gateway's config file and ``--provider``: one shape, both MiB spellings, errors
that name the file and the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kubemoot.api.errors import InputError
from kubemoot.gateway.config import parse_config, parse_provider
from kubemoot.gateway.reload import assemble_fleet
from tests.gateway.conftest import OllamaEmulator  # the emulator, wherever it lives
from tests.providers.test_cli import kubemoot

HOMELAB = """
servers:
  big:
    url: http://big.lan:11434
    vramMiB: 24576
    numParallel: 2
    contextLength: 8192
    labels: {room: study}
  small:
    url: small.lan:11434
    vramMib: 8192          # the spec's spelling works too
    reserveMib: 512
models:
  qwen3:14b:
    vramMiB: 11264
    labels: {capability/code: "true"}
    pinned: [big]
  llama3.2:3b:
    vramMib: 2600
    servers: [small]
classes:
  coder:
    require: {matchLabels: {capability/code: "true"}}
keys:
  alice: sk-alice
limits:
  waitLimit: 1m30s
  maxKeepAlive: 1h
  probeInterval: 2s
"""


def test_a_hand_written_config_reads_into_the_fleet() -> None:
    config = parse_config(HOMELAB, file="gateway.yaml")
    fleet = assemble_fleet(config)
    big, small = fleet.providers
    assert (big.name, big.endpoint, big.total_vram_mib, big.num_parallel,
            big.context_length, big.pinned) == (
        "big", "http://big.lan:11434", 24576, 2, 8192, ("qwen3:14b",))
    assert (small.endpoint, small.total_vram_mib, small.reserve_mib, small.pinned) == (
        "http://small.lan:11434", 8192, 512, ())
    assert fleet.declared == {"qwen3:14b": 11264, "llama3.2:3b": 2600}
    assert fleet.virtual is not None and fleet.virtual.names() == ["coder"]
    coder = fleet.virtual.candidates("coder")
    assert coder is not None and [c.model for c in coder] == ["qwen3:14b"]
    assert fleet.keys is not None and fleet.keys.caller("Bearer sk-alice") == "alice"
    assert (fleet.settings.wait_limit_seconds, fleet.settings.max_keep_alive_seconds,
            fleet.settings.provider_probe_seconds) == (90.0, 3600.0, 2.0)


def test_flags_win_over_the_config_and_the_config_over_the_defaults() -> None:
    from kubemoot.gateway.config import Limits

    config = parse_config("limits: {waitLimit: 20s}", file="g.yaml")
    fleet = assemble_fleet(config, flag_limits=Limits(wait_limit_seconds=5.0,
                                                      probe_interval_seconds=None))
    assert fleet.settings.wait_limit_seconds == 5.0
    assert assemble_fleet(config).settings.wait_limit_seconds == 20.0


@pytest.mark.parametrize(("text", "field", "words"), [
    ("servers: {big: {url: 'http://b:1', vramGB: 24}}", "servers.big.vramGB",
     "unknown field"),
    ("servers: {big: {url: 'http://b:1', vramMiB: 1, vramMib: 2}}", "servers.big",
     "one field"),
    ("servers: {big: {url: 'ftp://b'}}", "servers.big.url", "malformed endpoint"),
    ("servers: {big: {url: 'http://b:1', numParallel: 0}}", "servers.big.numParallel",
     "greater than"),
    ("models: {'q:1': {pinned: [nowhere]}}", "models[q:1].pinned", "no server"),
    ("limits: {waitLimit: soon}", "limits.waitLimit", "not a duration"),
    ("limits: {probeInterval: 0s}", "limits.probeInterval", "more than 0"),
    ("keys: {alice: k, bob: k}", "keys.bob", "another name's key"),
    ("classes: {coder: {tolerance: -1}}", "classes.coder.tolerance", "greater than"),
    ("- just a list", None, "must be a mapping"),
])
def test_a_mistake_names_the_file_and_the_field(text: str, field: str | None,
                                                words: str) -> None:
    with pytest.raises(InputError) as caught:
        assemble_fleet(parse_config(text, file="gateway.yaml"))
    assert caught.value.file == "gateway.yaml"
    assert caught.value.field == field
    assert words in caught.value.message


def test_a_bad_duration_names_its_field_once() -> None:
    with pytest.raises(InputError) as caught:
        assemble_fleet(parse_config("limits: {waitLimit: soon}", file="gateway.yaml"))
    shown = str(caught.value)
    assert shown.count("limits.waitLimit") == 1, shown
    assert "'soon' is not a duration" in shown


@pytest.mark.parametrize("spelling", ["vramMiB", "vramMib"])
def test_provider_flag_takes_either_mib_spelling(spelling: str) -> None:
    source = parse_provider(f"gpu=http://h:1,{spelling}=8192,numParallel=2,reserveMib=256")
    assert (source.name, source.total_vram_mib, source.num_parallel, source.reserve_mib) == (
        "gpu", 8192, 2, 256)


@pytest.mark.parametrize(("text", "words"), [
    ("gpu=http://h:1,vramGB=8", "is not one of vramMiB=N"),
    ("gpu=http://h:1,vramMiB=8,vramMib=9", "given twice"),
    ("gpu=http://h:1,numParallel=0", "at least 1"),
])
def test_provider_flag_mistakes(text: str, words: str) -> None:
    with pytest.raises(InputError, match=words) as caught:
        parse_provider(text)
    assert caught.value.field == "--provider"


def test_probe_takes_the_gateway_provider_syntax(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    emulator = make_emulator()
    done = kubemoot("probe", "--provider",
                    f"live={emulator.url},vramMib=8192,numParallel=3,contextLength=2048",
                    "-o", "json")
    assert done.returncode == 0, done.stderr
    [state] = json.loads(done.stdout)
    assert (state["provider"], state["totalVramMiB"], state["maxParallel"],
            state["contextLength"]) == ("live", 8192, 3, 2048)
    bad = kubemoot("probe", "--provider", f"live={emulator.url},vramGB=8")
    assert bad.returncode == 2 and "--provider" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_gateway_refuses_a_bad_config_at_start(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("servers: {big: {url: 'http://127.0.0.1:9', vramGiB: 24}}\n")
    done = kubemoot("gateway", "-c", str(config), "--listen", "127.0.0.1:0")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert str(config) in done.stderr and "servers.big.vramGiB" in done.stderr


def test_the_config_docs_gateway_md_shows_reads_as_it_says() -> None:
    import re

    doc = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    [text] = [m.group(1) for m in re.finditer(r"```yaml\n(# gateway\.yaml\n.*?)```", doc,
                                              re.S)]
    fleet = assemble_fleet(parse_config(text, file="docs/gateway.md"))
    assert [(s.name, s.total_vram_mib, s.pinned) for s in fleet.providers] == [
        ("big", 32768, ()), ("small", 24576, ("qwen3:14b",))]
    assert fleet.declared == {"qwen3:14b": 9856, "qwen3:32b": None}
    assert fleet.virtual is not None and fleet.virtual.candidates("tools") is not None
    assert fleet.keys is not None and fleet.settings.max_keep_alive_seconds == 1800


@pytest.mark.parametrize("spelling", ["vramMiB", "vramMib"])
def test_scenarios_and_placement_states_take_either_spelling(spelling: str) -> None:
    from kubemoot.runtime.what_if import DeclaredModel
    from kubemoot.sim.scenario import ScenarioModel

    assert ScenarioModel.model_validate({"name": "q:1", spelling: 512}).vram_mib == 512
    assert DeclaredModel.model_validate({"name": "q:1", spelling: 512}).vram_mib == 512


def test_a_bundle_model_pinned_to_its_provider(tmp_path: Path) -> None:
    bundle = tmp_path / "fleet.yaml"
    bundle.write_text("""
apiVersion: kubemoot.ai/v1alpha1
kind: ModelProvider
metadata: {name: gpu}
spec: {endpoint: "http://127.0.0.1:11434"}
status: {capacity: {vramTotalMiB: 24576}}
---
apiVersion: kubemoot.ai/v1alpha1
kind: Model
metadata: {name: qwen3-14b}
spec: {model: "qwen3:14b", providerRef: gpu, vramMiB: 9216, pinned: true}
---
apiVersion: kubemoot.ai/v1alpha1
kind: Model
metadata: {name: qwen3-8b}
spec: {model: "qwen3:8b", providerRef: gpu, vramMib: 5120}
""")
    fleet = assemble_fleet(None, files=[bundle])
    [gpu] = fleet.providers
    assert gpu.pinned == ("qwen3:14b",) and gpu.total_vram_mib == 24576
    assert fleet.declared == {"qwen3:14b": 9216, "qwen3:8b": 5120}
