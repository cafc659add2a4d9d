"""Provider-side errors that are worked around still leave a log line and a count."""

from __future__ import annotations

import logging

import pytest

from kubemoot import metrics
from kubemoot.clock import ManualClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV


def _survived(component: str, operation: str) -> float:
    """The count of one component's operation, whatever the kind of error."""
    return sum(
        sample.value for family in metrics.REGISTRY.collect()
        if family.name == "kubemoot_errors_survived" for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("component") == component
        and sample.labels.get("operation") == operation
    )


def _client(emulator: OllamaEmulator, **extra: object) -> OllamaProvider:
    return OllamaProvider("gpu-a", emulator.url, context_length=1024, total_vram_mib=8192,
                          max_retries=0, **extra)  # type: ignore[arg-type]


async def test_an_unreadable_stored_state_is_logged_and_counted(
    emulator: OllamaEmulator, caplog: pytest.LogCaptureFixture,
) -> None:
    kv = MemoryKV()
    bucket = await kv.bucket(PROVIDER_STATE_BUCKET)
    await bucket.put(encode_token("gpu-a"), b'{"provider": "gpu-a", "ready": "maybe"')
    before = _survived("prober", "read-state")
    async with _client(emulator) as client:
        with caplog.at_level(logging.WARNING, logger="kubemoot.providers.prober"):
            [state] = await Prober([client], clock=ManualClock(),
                                   publish=publish_to_kv(bucket)).probe_all()
    assert state.ready  # the probe itself goes on: only the old footprints are lost
    assert _survived("prober", "read-state") == before + 1
    assert any("stored state of gpu-a is unreadable" in r.getMessage()
               for r in caplog.records)


async def test_a_failed_publish_is_logged_and_counted(emulator: OllamaEmulator) -> None:
    kv = MemoryKV()
    bucket = await kv.bucket(PROVIDER_STATE_BUCKET)
    await kv.close()  # every write from here on fails
    before = _survived("prober", "publish")
    reads_before = _survived("prober", "read-state")
    async with _client(emulator) as client:
        [state] = await Prober([client], clock=ManualClock(),
                               publish=publish_to_kv(bucket)).probe_all()
    assert state.ready
    assert _survived("prober", "publish") == before + 1
    assert _survived("prober", "read-state") > reads_before


async def test_a_dead_dcgm_exporter_is_counted(
    emulator: OllamaEmulator, closed_port: int,
) -> None:
    before = _survived("provider", "dcgm")
    async with _client(emulator, dcgm_url=f"http://127.0.0.1:{closed_port}/metrics") as client:
        state = await client.probe()
    assert state.ready and state.total_vram_mib == 8192
    assert _survived("provider", "dcgm") == before + 1
