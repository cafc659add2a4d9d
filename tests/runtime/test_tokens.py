"""The token estimator: characters ÷ a learned characters-per-token ratio."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.runtime.tokens import TokenEstimator, message_chars, prompt_chars


@pytest.mark.parametrize(
    ("chars", "tokens"),
    [(0, 0), (1, 1), (7, 2), (35, 10), (36, 11), (3500, 1000)],
)
def test_estimate_before_any_report_uses_three_and_a_half(chars: int, tokens: int) -> None:
    assert TokenEstimator().estimate(chars) == tokens


def test_ema_moves_toward_reported_ratio() -> None:
    estimator = TokenEstimator(alpha=0.5)
    estimator.observe(chars=4000, tokens=1000)  # prose: 4.0
    assert estimator.chars_per_token == pytest.approx(3.75)
    estimator.observe(chars=4000, tokens=1000)
    assert estimator.chars_per_token == pytest.approx(3.875)
    assert estimator.observations == 2


@pytest.mark.parametrize(
    ("chars", "tokens", "truncated"),
    [
        (4000, 1000, True),  # a cut prompt reports the cut size: never learn from it
        (4000, 0, False),
        (0, 10, False),
        (100_000, 10, False),  # 10 000 chars/token is noise, not a tokenizer
    ],
)
def test_reports_that_would_mislead_are_ignored(chars: int, tokens: int, truncated: bool) -> None:
    estimator = TokenEstimator()
    estimator.observe(chars=chars, tokens=tokens, truncated=truncated)
    assert estimator.chars_per_token == 3.5
    assert estimator.observations == 0


@settings(max_examples=50, deadline=None)
@given(
    reports=st.lists(
        st.tuples(st.integers(1, 10_000), st.floats(1.5, 6.0)), min_size=1, max_size=30
    )
)
def test_learned_ratio_stays_within_the_reported_range(
    reports: list[tuple[int, float]],
) -> None:
    estimator = TokenEstimator()
    ratios = [3.5]
    for tokens, ratio in reports:
        estimator.observe(chars=round(tokens * ratio), tokens=tokens)
        ratios.append(round(tokens * ratio) / tokens)
    assert min(ratios) - 1e-9 <= estimator.chars_per_token <= max(ratios) + 1e-9


def test_prompt_chars_count_tool_arguments_and_specs() -> None:
    call = {"function": {"name": "kubectl", "arguments": {"args": "get pods"}}}
    message = {"role": "assistant", "content": "abc", "tool_calls": [call]}
    assert message_chars(message) == 3 + len("kubectl") + len('{"args": "get pods"}')
    spec = {"type": "function", "function": {"name": "x"}}
    with_spec = prompt_chars([message], [spec])
    assert with_spec > prompt_chars([message])
