"""Quality bias: a crew's speed-versus-quality lean, turned into a score per Model.

A CrewSchedulingPolicy maps capabilities to a bias in [0, 1] (strings, as the CRD keeps
them). An Agent's *effective* bias is the largest bias among its capabilities, else the
``default`` entry, else there is none. For a rule without a prefer block, a Model's
``latencyClass`` label then contributes ``high = 100·b``, ``medium = 50`` and
``low = 100·(1 − b)`` (DESIGN §4), so neighbouring tiers sit ``|b − 0.5|·100`` apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

__all__ = [
    "DEFAULT_BIAS_KEY",
    "LATENCY_CLASS_LABEL",
    "BiasTable",
    "effective_bias",
    "latency_tier_score",
    "parse_bias",
]

DEFAULT_BIAS_KEY = "default"
LATENCY_CLASS_LABEL = "latencyClass"


def parse_bias(text: str) -> float | None:
    """The bias a value states, or None when it is not a float in [0, 1] (then it is ignored)."""
    try:
        value = float(text.strip())
    except (ValueError, AttributeError):
        return None
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        return None
    return value


def effective_bias(quality_bias: Mapping[str, str], capabilities: Iterable[str]) -> float | None:
    """Max over the Agent's mapped capabilities, else ``default``, else None.

    Taking the maximum errs toward quality: one capability that asks for it is enough.
    Values that do not parse count as unmapped.
    """
    return BiasTable(quality_bias).effective(capabilities)


class BiasTable:
    """A policy's qualityBias parsed once, for the many Agents it governs."""

    __slots__ = ("_by_capability", "_default")

    def __init__(self, quality_bias: Mapping[str, str]) -> None:
        parsed = {key: parse_bias(text) for key, text in quality_bias.items()}
        self._by_capability = {key: value for key, value in parsed.items() if value is not None}
        self._default = parsed.get(DEFAULT_BIAS_KEY)

    def effective(self, capabilities: Iterable[str]) -> float | None:
        """See :func:`effective_bias`."""
        best: float | None = None
        get = self._by_capability.get
        for capability in capabilities:
            value = get(capability)
            if value is not None and (best is None or value > best):
                best = value
        return self._default if best is None else best


def latency_tier_score(bias: float, latency_class: str | None) -> float:
    """The quality-bias term for one Model; 0 when its latencyClass is absent or unknown."""
    if latency_class == "high":
        return round(100.0 * bias, 9)
    if latency_class == "medium":
        return 50.0
    if latency_class == "low":
        return round(100.0 * (1.0 - bias), 9)
    return 0.0
