"""A ModelClass's candidates are exactly what the control plane would publish for a
rule with the same selectors or bias: same scores, same order, same preferred model."""

from __future__ import annotations

from typing import Any

import pytest

from kubemoot.api import Model, ModelClass, ModelProvider
from kubemoot.scheduling.model_class import resolve_model_class
from kubemoot.testing.builders import agent, model, policy, provider, rule, selector

from .conftest import NOW, run
from .test_scheduler import TOOLS, tiers

GPU = provider("gpu", vram_total_mib=32768, max_parallel=4)


def model_class(name: str = "fast", **spec: Any) -> ModelClass:
    return ModelClass.model_validate({"metadata": {"name": name}, "spec": spec})


def published(models: list[Model], providers: list[ModelProvider], *,
              prefer: list[tuple[int, dict[str, str]]] | None = None,
              bias: str | None = None) -> tuple[list[tuple[str, float]], str | None]:
    """The mulling candidate list and bound identifier the scheduler publishes for an
    Agent whose policy has the same require and prefer (or a default bias)."""
    the_policy = policy("crew", crew_ref="crew",
                        quality_bias={"default": bias} if bias is not None else None,
                        rules=[rule("mulling", require=TOOLS, prefer=prefer or ()),
                               rule("triage", require=TOOLS)])
    result = run(models=models, providers=providers, policies=[the_policy],
                 agents=[agent("a", crew="crew")])
    phase = result.agent("crew-a", "a").phases["mulling"]  # type: ignore[union-attr]
    bound = next((m.spec.model for m in models if m.metadata.name == phase.model), None)
    return list(phase.candidates), bound


@pytest.mark.parametrize(
    ("spec", "prefer", "bias"),
    [
        pytest.param({"qualityBias": "0.7"}, [], "0.7", id="bias-favours-quality"),
        pytest.param({"qualityBias": 0.3}, [], "0.3", id="bias-favours-speed"),
        pytest.param({"prefer": [{"weight": 60, "selector": {"matchLabels": {"params": "14B"}}},
                                 {"weight": 30, "selector": {"matchLabels": {"params": "8B"}}}]},
                     [(60, {"params": "14B"}), (30, {"params": "8B"})], None, id="prefer"),
        pytest.param({"prefer": [{"weight": 10, "selector": {"matchLabels": {"params": "8B"}}}],
                      "qualityBias": "0.9"},
                     [(10, {"params": "8B"})], "0.9", id="prefer-wins-over-bias"),
        pytest.param({}, [], None, id="no-preference"),
    ],
)
def test_same_list_as_the_control_plane_publishes(
    spec: dict[str, Any], prefer: list[tuple[int, dict[str, str]]], bias: str | None,
) -> None:
    models = tiers()
    resolved = resolve_model_class(
        model_class(**spec, require={"matchLabels": TOOLS}), models, [GPU], now=NOW)
    candidates, bound = published(models, [GPU], prefer=prefer, bias=bias)
    assert list(resolved.candidates) == candidates
    assert resolved.preferred == bound and candidates[0][0] == bound


def test_bias_scores_follow_the_tiers() -> None:
    resolved = resolve_model_class(model_class(qualityBias="0.7"), tiers(), [GPU], now=NOW)
    assert list(resolved.candidates) == [("qwen3:32b", 70.0), ("qwen3:14b", 50.0),
                                         ("qwen3:8b", 30.0)]
    assert resolved.to_json() == ('[{"model":"qwen3:32b","score":70},'
                                  '{"model":"qwen3:14b","score":50},'
                                  '{"model":"qwen3:8b","score":30}]')


def test_the_preferred_model_leads_even_with_a_lower_score() -> None:
    # the 32b is wanted most, but its card is too small for it: the 14b is bound
    small = provider("gpu", vram_total_mib=16384, max_parallel=4)
    resolved = resolve_model_class(model_class(qualityBias="0.7"), tiers(), [small], now=NOW)
    assert resolved.preferred == "qwen3:14b"
    assert list(resolved.candidates) == [("qwen3:14b", 50.0), ("qwen3:32b", 70.0),
                                         ("qwen3:8b", 30.0)]
    assert (list(resolved.candidates), resolved.preferred) == published(
        tiers(), [small], bias="0.7")


def test_without_providers_every_admitted_ready_model_is_listed_by_score() -> None:
    models = [*tiers(), model("gone-1b", model_id="gone:1b", labels=TOOLS, ready=False),
              model("other-3b", model_id="other:3b", labels={"latencyClass": "high"})]
    resolved = resolve_model_class(
        model_class(require={"matchLabels": TOOLS}, qualityBias="0.3"), models, now=NOW)
    assert resolved.preferred is None
    assert list(resolved.candidates) == [("qwen3:8b", 70.0), ("qwen3:14b", 50.0),
                                         ("qwen3:32b", 30.0)]


def test_an_identifier_on_two_providers_is_listed_once() -> None:
    models = [*tiers("gpu-a"), *tiers("gpu-b", suffix="-b")]
    gpus = [provider("gpu-a", vram_total_mib=32768, max_parallel=4),
            provider("gpu-b", vram_total_mib=32768, max_parallel=4)]
    resolved = resolve_model_class(
        model_class(require={"matchExpressions": [
            {"key": "params", "operator": "In", "values": ["8B", "14B"]}]}),
        models, gpus, now=NOW)
    assert sorted(model_id for model_id, _ in resolved.candidates) == ["qwen3:14b", "qwen3:8b"]


def test_a_selector_nothing_matches_gives_an_empty_list() -> None:
    resolved = resolve_model_class(
        model_class(require=selector({"family": "llama"}).model_dump(by_alias=True)),
        tiers(), [GPU], now=NOW)
    assert resolved.candidates == () and resolved.preferred is None


@pytest.mark.parametrize(("stated", "default", "expected"),
                         [(5.0, 10.0, 5.0), (None, 10.0, 10.0), (None, None, None),
                          (0, 10.0, 0.0)])
def test_tolerance_is_the_classes_or_the_runtimes(
    stated: float | None, default: float | None, expected: float | None,
) -> None:
    spec: dict[str, Any] = {} if stated is None else {"tolerance": stated}
    resolved = resolve_model_class(model_class(**spec), tiers(), now=NOW,
                                   default_tolerance=default)
    assert resolved.tolerance == expected
