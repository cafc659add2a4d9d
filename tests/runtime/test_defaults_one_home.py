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
import kubemoot.api.provider as api_provider
api_provider.DEFAULT_RESERVE_MIB = 777
import kubemoot.runtime.settings as settings
changed = {
    f.name: (f.default * 3 + 7 if isinstance(f.default, int | float) else f.default)
    for f in dataclasses.fields(settings.RuntimeSettings)
}
changed["reserve_mib"] = 777
changed["latency_ema_alpha"] = 0.77
settings.DEFAULTS = settings.RuntimeSettings(**changed)

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
from kubemoot.sim.scenario import ProviderSpec, ScenarioSettings
from kubemoot.store.documents import ProviderState
from kubemoot.agent.discussion import Coordinator
from kubemoot.dashboard.app import DashboardSettings
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
    "ProviderSpec.reserve_mib": (ProviderSpec.model_fields["reserve_mib"].default, 777),
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
        [d.probe_interval_seconds, d.probe_timeout_seconds, d.shutdown_grace_seconds],
    ),
    "Coordinator.deadline_seconds":
        (default(Coordinator, "deadline_seconds"), d.gpu_wait_limit_seconds),
    "DashboardSettings": (
        [DashboardSettings().coalesce_seconds, DashboardSettings().refresh_seconds,
         DashboardSettings().max_clients, DashboardSettings().store_check_seconds],
        [d.dashboard_coalesce_seconds, d.dashboard_refresh_seconds, d.dashboard_max_clients,
         d.store_check_seconds],
    ),
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
    assert len(seen) == 27
    drifted = {name: pair for name, pair in seen.items() if pair[0] != pair[1]}
    assert drifted == {}, f"defaults that do not read their home: {drifted}"


def test_runtime_reserve_is_the_resource_api_default() -> None:
    from kubemoot.api.provider import DEFAULT_RESERVE_MIB
    from kubemoot.runtime.settings import DEFAULTS, RuntimeSettings

    assert RuntimeSettings().reserve_mib == DEFAULTS.reserve_mib == DEFAULT_RESERVE_MIB


def test_provider_clients_take_the_deployments_read_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat pool's client (CallSettings without a timeout) and a bare OllamaProvider
    read KUBEMOOT_PROVIDER_READ_TIMEOUT_SECONDS; an explicit timeout still wins."""
    from kubemoot.agent.pool import CallSettings
    from kubemoot.providers.ollama import OllamaProvider
    from kubemoot.runtime.settings import DEFAULTS, ENV_VARIABLES

    url = "http://127.0.0.1:1"
    assert OllamaProvider("p", url).timeout == DEFAULTS.provider_read_timeout_seconds
    monkeypatch.setenv(ENV_VARIABLES["provider_read_timeout_seconds"], "7.5")
    assert OllamaProvider("p", url, timeout=CallSettings().timeout).timeout == 7.5
    assert OllamaProvider("p", url).timeout == 7.5
    assert OllamaProvider("p", url, timeout=3.0).timeout == 3.0
