"""A store error worked around during teardown still leaves a log line and a count."""

from __future__ import annotations

import logging

import pytest

from kubemoot import metrics
from kubemoot.settings import NatsSettings
from kubemoot.store.nats import NatsKV


def _survived(operation: str) -> float:
    labels = {"component": "store", "operation": operation, "kind": "cleanup"}
    value = metrics.REGISTRY.get_sample_value("kubemoot_errors_survived_total", labels)
    return 0.0 if value is None else value


async def test_a_watch_that_cannot_unsubscribe_says_so(
    nats_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    bucket = await kv.bucket("survived_unwatch")
    watch = bucket.watch()
    await watch.ready()
    before = _survived("unwatch")
    await kv._nc.close()  # the connection is gone before the watch is torn down
    with caplog.at_level(logging.WARNING, logger="kubemoot.store.nats"):
        await watch.aclose()
    await kv.close()
    assert _survived("unwatch") == before + 1
    assert any("unsubscribing the watch of survived_unwatch failed" in r.getMessage()
               for r in caplog.records)
