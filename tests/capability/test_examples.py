"""Every shipped example decides as its annotations say."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubemoot.capability import decide, load_request

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "decide").glob("*.yaml"))


def test_the_lab_cases_are_shipped() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"case-1-baseline", "case-3-transfer", "case-4-telemetry-label-trap"} <= names
    assert "case-8-score-trap" in names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_decides_as_expected(path: Path) -> None:
    request = load_request(path.read_text(encoding="utf-8"), file=str(path))
    annotations = request.metadata.annotations
    expected_outcome = annotations["kubemoot.ai/expected-outcome"]
    expected_node = annotations.get("kubemoot.ai/expected-node") or None
    record = decide(request)
    assert record.outcome.value == expected_outcome, record.reason
    assert record.chosen == expected_node, record.reason
