"""The crew's answer when its agents could not get a GPU."""

from __future__ import annotations

import pytest

from kubemoot.agent.answers import (
    GPU_BUSY_TEXT,
    PROMPT_TOO_LARGE_TEXT,
    CapacityRecord,
    capacity_answer,
)
from kubemoot.agent.signals import Signal, SignalMetadata, SignalType


def _aside(agent: str, reason: str, model: str | None = None) -> Signal:
    return Signal(
        SignalType.STAND_ASIDE, agent, "t1", 0.0,
        metadata=SignalMetadata(reason=reason, model=model),
    )


def _waiting(agent: str) -> Signal:
    return Signal(
        SignalType.WAITING, agent, "t1", 0.0,
        metadata=SignalMetadata(reason="gpu-busy", model="qwen3:32b"),
    )


@pytest.mark.parametrize(
    ("signals", "still_waiting", "must_contain", "must_not_contain"),
    [
        ([_aside("a", "gpu-busy")], [], ["busy", "ask again"], ["OLLAMA_CONTEXT_LENGTH"]),
        ([_waiting("a")], ["a"], ["busy"], ["large enough"]),
        (
            [_aside("a", "model-too-large", "qwen3:235b")], [],
            ["qwen3:235b", "smaller Model", "larger GPU"], ["busy"],
        ),
        (
            [_aside("a", "prompt-too-large", "qwen3:8b")], [],
            ["OLLAMA_CONTEXT_LENGTH", "shorten"], ["busy", "qwen3:8b"],
        ),
        (
            [_aside("a", "model-too-large", "big:1t"), _aside("b", "prompt-too-large")], [],
            ["big:1t", "OLLAMA_CONTEXT_LENGTH"], ["busy"],
        ),
    ],
    ids=["gpu-busy", "still-waiting", "model-too-large", "prompt-too-large", "both"],
)
def test_each_reason_gives_its_sentence(
    signals: list[Signal],
    still_waiting: list[str],
    must_contain: list[str],
    must_not_contain: list[str],
) -> None:
    answer = capacity_answer(CapacityRecord.from_signals(signals, still_waiting=still_waiting))
    assert answer is not None
    for text in must_contain:
        assert text in answer
    for text in must_not_contain:
        assert text not in answer


def test_both_reasons_give_both_sentences_in_order() -> None:
    record = CapacityRecord(gpu_busy=True, prompt_too_large=True)
    assert capacity_answer(record) == f"{GPU_BUSY_TEXT} {PROMPT_TOO_LARGE_TEXT}"


def test_waiting_that_later_resolved_is_not_a_capacity_reason() -> None:
    # the agent waited, then got a GPU: it is not "still waiting" when the thread settles
    record = CapacityRecord.from_signals([_waiting("a")], still_waiting=[])
    assert capacity_answer(record) is None


def test_no_capacity_reason_means_no_capacity_answer() -> None:
    failure = Signal(SignalType.FAILURE, "a", "t1", 0.0)
    assert capacity_answer(CapacityRecord.from_signals([failure])) is None


def test_the_sentences_are_the_specs_own() -> None:
    # User-facing text the spec prescribes word for word (its typographic apostrophes
    # included); only the model name is filled in.
    record = CapacityRecord(gpu_busy=True, too_large_models=["qwen3:235b"],
                            prompt_too_large=True)
    assert capacity_answer(record) == (
        "The crew’s agents could not get a GPU: every GPU was busy with other work, so "
        "none of them could answer in time. This is the cluster’s capacity, not the "
        "crew’s design; ask again in a moment. "
        "No GPU in this cluster can hold the model qwen3:235b the agents need; add a "
        "smaller Model or a larger GPU. "
        "No provider gives an acceptable model a context that holds the prompt. Raise the "
        "per-request context on a provider (OLLAMA_CONTEXT_LENGTH) or shorten what the "
        "crew sends."
    )
