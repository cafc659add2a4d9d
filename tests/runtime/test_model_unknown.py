"""model-unknown: a name no provider lists and no Model declares is refused at once."""

from __future__ import annotations

import pytest

from kubemoot.runtime.placement import Action
from kubemoot.runtime.refusals import Reason
from kubemoot.store.documents import ProviderState
from kubemoot.testing.state import gpu


def _listing(state: ProviderState, **disk_gib: float) -> ProviderState:
    state.disk_sizes_mib = {m: int(g * 1024) for m, g in disk_gib.items()}
    return state


async def test_a_typo_is_refused_at_once_not_waited_on(make) -> None:
    h = await make([gpu("a", 24, residents={"qwen3:8b": 6})], declared={"qwen3:14b": 12})
    placed = await h.place("qwen3:14bb")
    assert placed.action is Action.REFUSE
    assert placed.reason == Reason.MODEL_UNKNOWN.value
    assert placed.decision is not None and "qwen3:14bb" in placed.decision.reason


async def test_every_acceptable_model_unknown_is_needed_for_the_refusal(make) -> None:
    # The preferred name is a typo, but a tolerated candidate is real (and busy): wait.
    h = await make([gpu("a", 8, residents={"qwen3:8b": 6})], declared={"qwen3:14b": 12})
    placed = await h.place(("qwen3:14bb", 70), ("qwen3:14b", 65))
    assert placed.action is Action.WAIT and placed.reason == Reason.GPU_BUSY.value


@pytest.mark.parametrize(
    ("providers", "declared", "model"),
    [
        # listed on a provider's disk (its /api/tags), declared nowhere
        ([_listing(gpu("a", 24, residents={"x": 6}), **{"qwen3:14b": 9})], {}, "qwen3:14b"),
        # declared by a Model resource, on no provider yet
        ([gpu("a", 24, residents={"x": 6})], {"qwen3:14b": 12}, "qwen3:14b"),
        # a provider that is down cannot say what it holds
        ([gpu("a", 8, residents={"x": 6}), gpu("b", 24, ready=False)], {}, "qwen3:14b"),
    ],
    ids=["listed", "declared", "a-provider-down"],
)
async def test_known_or_possibly_known_models_wait(
    make, providers: list[ProviderState], declared: dict[str, float], model: str
) -> None:
    h = await make(providers, declared=declared)
    placed = await h.place(model)
    assert placed.action is not Action.REFUSE
    assert placed.reason != Reason.MODEL_UNKNOWN.value
