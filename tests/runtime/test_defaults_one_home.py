"""Each runtime default has one home (DESIGN §10): everything else reads it from there.

The check runs in a fresh interpreter that changes the home *before* importing the
modules that take those numbers, so a copy of a literal anywhere else shows up as a
value that did not follow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_SRC = Path(__file__).resolve().parents[2] / "src"

_PROBE = r"""
import dataclasses, inspect, json
import functools
import kubemoot.settings as settings
settings.DEFAULT_RESERVE_MIB = 777
changed = {
    f.name: (f.default * 3 + 7 if isinstance(f.default, int | float) else f.default)
    for f in dataclasses.fields(settings.RuntimeSettings)
}
changed["reserve_mib"] = 777
changed["latency_ema_alpha"] = 0.77
settings.DEFAULTS = settings.RuntimeSettings(**changed)
process = settings.ProcessSettings()
process_changed = {f.name: getattr(process, f.name) * 3 + 7
                   for f in dataclasses.fields(settings.ProcessSettings)}
# code that takes a process default builds ProcessSettings(): hand it the changed ones
settings.ProcessSettings = functools.partial(settings.ProcessSettings, **process_changed)
p = settings.ProcessSettings()

from kubemoot.emulation.card import OLLAMA_KEEP_ALIVE_SECONDS, EmulatorConfig
from kubemoot.emulation.engine import CardSpec
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.runtime.demand import DemandBoard
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.what_if import SnapshotSettings
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.scenario import ScenarioProvider, ScenarioSettings
from kubemoot.store.documents import ProviderState
from kubemoot.agent.discussion import Coordinator
from kubemoot.operator.reconciler import Reconciler
from kubemoot.operator.run import OperatorOptions

def default(obj, name):
    return inspect.signature(obj).parameters[name].default

d = settings.DEFAULTS
seen = {
    "LatencyTracker.alpha": (default(LatencyTracker, "alpha"), d.latency_ema_alpha),
    "LatencyTracker.default_seconds":
        (default(LatencyTracker, "default_seconds"), d.default_latency_seconds),
    "CircuitBreakers.threshold":
        (default(CircuitBreakers, "threshold"), d.circuit_failure_threshold),
    "CircuitBreakers.cooldown_seconds":
        (default(CircuitBreakers, "cooldown_seconds"), d.circuit_cooldown_seconds),
    "TicketManager.ttl_seconds": (default(TicketManager, "ttl_seconds"), d.ticket_ttl_seconds),
    "TicketManager.max_attempts": (default(TicketManager, "max_attempts"), d.claim_attempts),
    "DemandBoard.settings": (default(DemandBoard, "settings") is d, True),
    "ProviderSnapshot.latency_seconds":
        (default(ProviderSnapshot, "latency_seconds"), d.default_latency_seconds),
    "OllamaProvider.reserve_mib": (default(OllamaProvider, "reserve_mib"), 777),
    "ProviderState.reserve_mib": (ProviderState.model_fields["reserve_mib"].default, 777),
    "EmulatorConfig.load_rate_mibps": (EmulatorConfig().load_rate_mibps, d.load_rate_mibps),
    "EmulatorConfig.keep_alive_s": (EmulatorConfig().keep_alive_s, OLLAMA_KEEP_ALIVE_SECONDS),
    "EmulatorConfig.prompt_per_token_s":
        (EmulatorConfig().prompt_per_token_s, d.prefill_seconds_per_token),
    "CardSpec.prefill_seconds_per_token":
        (CardSpec(vram_mib=100_000).prefill_seconds_per_token, d.prefill_seconds_per_token),
    "EmulatedGpu.reserve_mib": (default(EmulatedGpu, "reserve_mib"), 777),
    "EmulatedGpu.load_rate_mibps": (default(EmulatedGpu, "load_rate_mibps"), d.load_rate_mibps),
    "EmulatedGpu.unload_seconds": (default(EmulatedGpu, "unload_seconds"), d.unload_seconds),
    "ScenarioProvider.reserve_mib": (ScenarioProvider.model_fields["reserve_mib"].default, 777),
    "ScenarioSettings.load_rate_mibps":
        (ScenarioSettings().load_rate_mibps, d.load_rate_mibps),
    "ScenarioSettings.unload_seconds": (ScenarioSettings().unload_seconds, d.unload_seconds),
    "ScenarioSettings.gpu_wait_limit_seconds":
        (ScenarioSettings().gpu_wait_limit_seconds, d.gpu_wait_limit_seconds),
    "SnapshotSettings": (
        SnapshotSettings().model_dump(),
        {"load_rate_mibps": d.load_rate_mibps, "unload_seconds": d.unload_seconds,
         "default_latency_seconds": d.default_latency_seconds, "reserve_mib": 777,
         "candidate_tolerance": d.candidate_tolerance},
    ),
    "Reconciler.probe_interval":
        (default(Reconciler, "probe_interval"), d.probe_interval_seconds),
    "Reconciler.probe_timeout": (default(Reconciler, "probe_timeout"), d.probe_timeout_seconds),
    "OperatorOptions": (
        [OperatorOptions().probe_interval, OperatorOptions().probe_timeout,
         OperatorOptions().shutdown_grace_seconds],
        [d.probe_interval_seconds, d.probe_timeout_seconds, p.shutdown_grace_seconds],
    ),
    "Coordinator.deadline_seconds":
        (default(Coordinator, "deadline_seconds"), d.gpu_wait_limit_seconds),
}
print(json.dumps({name: [got, want] for name, (got, want) in seen.items()}))
"""


def test_every_copy_of_a_default_follows_its_home() -> None:
    env = {**os.environ, "PYTHONPATH": str(_SRC)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert len(seen) == 26
    drifted = {name: pair for name, pair in seen.items() if pair[0] != pair[1]}
    assert drifted == {}, f"defaults that do not read their home: {drifted}"


def test_runtime_reserve_is_the_resource_api_default() -> None:
    from kubemoot.api.provider import ProviderSpec
    from kubemoot.settings import DEFAULT_RESERVE_MIB, DEFAULTS, RuntimeSettings

    assert RuntimeSettings().reserve_mib == DEFAULTS.reserve_mib == DEFAULT_RESERVE_MIB
    assert ProviderSpec.model_fields["reserve_mib"].default == DEFAULT_RESERVE_MIB


def test_one_name_one_default_across_the_sections() -> None:
    """A setting's name means one thing: two sections that both carry a name carry the
    same default (the dashboard's store check is the process's). Two components that
    need different numbers get two names (the cluster's probe interval and the
    gateway's own)."""
    from dataclasses import fields

    from kubemoot.settings import Settings

    whole = Settings()
    seen: dict[str, tuple[str, object]] = {}
    for section in fields(whole):
        for item in fields(getattr(whole, section.name)):
            default = getattr(getattr(whole, section.name), item.name)
            if item.name in seen:
                first, value = seen[item.name]
                assert value == default, (
                    f"{item.name}: {value!r} in {first}, {default!r} in {section.name}")
            seen[item.name] = (section.name, default)
    assert "probe_interval_seconds" not in {f.name for f in fields(whole.gateway)}


def test_a_provider_client_does_not_read_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter takes its timeouts as values (DESIGN §10); the variables reach it only
    through the settings its entry point read."""
    from kubemoot.providers.ollama import OllamaProvider
    from kubemoot.settings import DEFAULTS, ENV_VARIABLES

    url = "http://127.0.0.1:1"
    monkeypatch.setenv(ENV_VARIABLES["runtime.provider_read_timeout_seconds"], "7.5")
    assert OllamaProvider("p", url).timeout == DEFAULTS.provider_read_timeout_seconds
    assert OllamaProvider("p", url, timeout=3.0).timeout == 3.0
