"""Errors worked around are counted in one counter, through one helper."""

from __future__ import annotations

import logging

import pytest

from kubemoot import metrics
from kubemoot.runtime import faults
from kubemoot.store.protocol import StoreUnavailable


def _value(**labels: str) -> float:
    found = metrics.REGISTRY.get_sample_value("kubemoot_errors_survived_total", labels)
    return 0.0 if found is None else found


def test_there_is_one_counter_of_survived_errors() -> None:
    names = {family.name for family in metrics.REGISTRY.collect()}
    assert "kubemoot_errors_survived" in names
    assert "kubemoot_state_errors" not in names


def test_a_runtime_fault_and_an_agent_fault_land_in_the_same_counter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = {"component": "runtime", "operation": "demand", "kind": "store"}
    agent = {"component": "agent", "operation": "release", "kind": "store"}
    before = _value(**runtime), _value(**agent)
    with caplog.at_level(logging.WARNING):
        with faults.tolerated("demand", "writing the demand board"):
            raise StoreUnavailable("no store")
        metrics.survived("agent", "release", metrics.STORE, "releasing ticket t1 failed",
                         StoreUnavailable("no store"))
    assert (_value(**runtime), _value(**agent)) == (before[0] + 1, before[1] + 1)
    assert "writing the demand board: no store (StoreUnavailable)" in caplog.text
    assert "releasing ticket t1 failed: no store (StoreUnavailable)" in caplog.text
