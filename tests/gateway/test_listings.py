"""The merged model listings, pure."""

from __future__ import annotations

import pytest

from kubemoot.gateway.listings import created_epoch, merge_tags


@pytest.mark.parametrize(("stamp", "epoch"), [
    ("2025-01-01T00:00:00Z", 1735689600),
    # Ollama's own modified_at: Go's RFC 3339 with nanoseconds and a zone offset
    ("2025-01-01T01:00:00.123456789+01:00", 1735689600),
    ("", 0), (None, 0), ("yesterday", 0), (17, 0),
])
def test_created_is_the_modified_time_in_epoch_seconds(stamp: object, epoch: int) -> None:
    assert created_epoch(stamp) == epoch


def test_each_model_lists_the_servers_that_hold_it() -> None:
    merged = merge_tags([("b", {"models": [{"name": "x:1"}, {"name": "y:1"}]}),
                         ("a", {"models": [{"name": "x:1"}, "junk"]})], ["team"])
    assert [(e["name"], e["providers"]) for e in merged] == [
        ("team", []), ("x:1", ["a", "b"]), ("y:1", ["b"])]
