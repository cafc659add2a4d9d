from __future__ import annotations

from pathlib import Path

import pytest

SCENARIOS = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


@pytest.fixture
def scenarios() -> Path:
    return SCENARIOS
