"""Table tests per scorer, and the quality-bias arithmetic of the spec."""

from __future__ import annotations

import pytest

from kubemoot.scheduling.bias import effective_bias, latency_tier_score, parse_bias
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins import (
    CapacityScorer,
    ImageLocalityScorer,
    ProviderWeightScorer,
    QualityScorer,
)
from kubemoot.testing.builders import model, provider, rule


def on(p: object) -> Placement:
    return Placement(model("qwen3-32b", vram_mib=20480), p)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("strategy", "used", "want"),
    [
        ("spread", 0, 100.0),
        ("spread", 24576, 25.0),
        ("binpack", 24576, 75.0),
        ("binpack", 0, 0.0),
        ("spread", 40000, 0.0),  # over-reported use clamps at no free room
    ],
)
def test_capacity(strategy: str, used: int, want: float) -> None:
    p = provider("a", vram_total_mib=32768, vram_used_mib=used)
    assert CapacityScorer(strategy).score(on(p)) == pytest.approx(want)  # type: ignore[arg-type]


def test_capacity_uses_loaded_sizes_when_used_is_absent() -> None:
    p = provider("a", vram_total_mib=32768, loaded=[("qwen3:14b", 16384)])
    assert CapacityScorer("spread").score(on(p)) == pytest.approx(50.0)


def test_capacity_ranks_providers_not_model_sizes() -> None:
    p = provider("a", vram_total_mib=32768, vram_used_mib=8192)
    small = Placement(model("qwen3-8b", vram_mib=5000), p)
    big = Placement(model("qwen3-32b", vram_mib=20000), p)
    assert CapacityScorer("spread").score(small) == CapacityScorer("spread").score(big)


@pytest.mark.parametrize(
    ("loaded", "want"), [([("qwen3:32b", 20000)], 100.0), ([("qwen3:8b", 5000)], 0.0), ([], 0.0)]
)
def test_image_locality(loaded: list[tuple[str, int]], want: float) -> None:
    assert ImageLocalityScorer().score(on(provider("a", loaded=loaded))) == want


@pytest.mark.parametrize(
    ("phase", "weight", "want"),
    [
        ("mulling", 100, 100.0),
        ("triage", 100, -100.0),
        ("triage", 25, -25.0),
        ("mulling", None, 100.0),
        ("synthesis", 100, 0.0),
    ],
)
def test_provider_weight(phase: str, weight: int | None, want: float) -> None:
    assert ProviderWeightScorer(phase).score(on(provider("a", weight=weight))) == want


@pytest.mark.parametrize(
    ("bias", "tier", "want"),
    [
        (0.7, "high", 70.0),
        (0.7, "medium", 50.0),
        (0.7, "low", 30.0),
        (0.3, "high", 30.0),
        (0.3, "medium", 50.0),
        (0.3, "low", 70.0),
        (0.5, "high", 50.0),
        (0.7, None, 0.0),
        (0.7, "ultra", 0.0),
    ],
)
def test_latency_tier(bias: float, tier: str | None, want: float) -> None:
    assert latency_tier_score(bias, tier) == pytest.approx(want)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0.7", 0.7),
        ("0", 0.0),
        ("1", 1.0),
        ("1.5", None),
        ("-0.1", None),
        ("high", None),
        ("nan", None),
        ("", None),
        (" 0.4 ", 0.4),
    ],
)
def test_parse_bias(text: str, want: float | None) -> None:
    assert parse_bias(text) == want


@pytest.mark.parametrize(
    ("bias", "capabilities", "want"),
    [
        ({"reasoning": "0.7", "tool-calling": "0.3"}, ["reasoning", "tool-calling"], 0.7),
        ({"reasoning": "0.7", "tool-calling": "0.3"}, ["tool-calling"], 0.3),
        ({"reasoning": "0.7", "default": "0.4"}, ["kubernetes"], 0.4),
        ({"reasoning": "0.7"}, ["kubernetes"], None),
        ({"reasoning": "lots", "default": "0.4"}, ["reasoning"], 0.4),
        ({}, ["reasoning"], None),
    ],
)
def test_effective_bias(bias: dict[str, str], capabilities: list[str], want: float | None) -> None:
    assert effective_bias(bias, capabilities) == want


def test_quality_prefer_sums_matching_weights_and_overrides_bias() -> None:
    the_rule = rule("mulling", prefer=[(100, {"params": "32B"}), (30, {"family": "qwen3"})])
    m = model("qwen3-32b", labels={"params": "32B", "family": "qwen3", "latencyClass": "low"})
    scorer = QualityScorer(the_rule, bias=0.9, bias_active=True)
    assert scorer.score(Placement(m, None)) == 130.0


def test_quality_bias_applies_without_prefer_only_when_active() -> None:
    m = model("qwen3-32b", labels={"latencyClass": "high"})
    assert QualityScorer(rule("mulling"), bias=0.7, bias_active=True).score(
        Placement(m, None)
    ) == pytest.approx(70.0)
    assert (
        QualityScorer(rule("mulling"), bias=None, bias_active=True).score(Placement(m, None)) == 0.0
    )
