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

    The max is deliberately conservative: if any of an agent's needs says quality
    matters, the agent gets the quality push. Unparsable values count as unmapped.
    """
    best: float | None = None
    for capability in capabilities:
        text = quality_bias.get(capability)
        value = None if text is None else parse_bias(text)
        if value is not None and (best is None or value > best):
            best = value
    if best is not None:
        return best
    fallback = quality_bias.get(DEFAULT_BIAS_KEY)
    return None if fallback is None else parse_bias(fallback)


def latency_tier_score(bias: float, latency_class: str | None) -> float:
    """The quality-bias term for one Model; 0 when its latencyClass is absent or unknown."""
    if latency_class == "high":
        return round(100.0 * bias, 9)
    if latency_class == "medium":
        return 50.0
    if latency_class == "low":
        return round(100.0 * (1.0 - bias), 9)
    return 0.0
