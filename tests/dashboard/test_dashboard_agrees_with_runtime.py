"""The page's memory figures are the runtime's: one home for usable/resident/loading/free.

The dashboard once summed a provider's memory with its own formula; where the two
disagreed (an engine listing two runners of one model, say) the page showed room the
planner did not see. Now both read :class:`ProviderSnapshot`.
"""

from __future__ import annotations

import pytest

from kubemoot.clock import ManualClock
from kubemoot.dashboard.fleet import FleetView
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.store.documents import ProviderState, ResidentModel, Ticket, TicketState
from kubemoot.store.memory import MemoryKV
from tests.dashboard.conftest import T0, Writers, state, ticket

LOADING, RUNNING, HELD = TicketState.LOADING, TicketState.RUNNING, TicketState.HELD


def _two_runners() -> ProviderState:
    """An engine that reports two runners of one model (two contexts, say)."""
    doc = state(loaded={"qwen3:14b": 12288})
    doc.loaded_models = [
        ResidentModel(name="qwen3:14b", size_mib=12288, context_length=4096),
        ResidentModel(name="qwen3:14b", size_mib=13312, context_length=8192),
    ]
    return doc


@pytest.mark.parametrize(
    ("doc", "tickets"),
    [
        pytest.param(state(loaded={"qwen3:14b": 12288}), [ticket("qwen3:8b", 6144, LOADING)],
                     id="cold-load-in-flight"),
        pytest.param(state(), [ticket("qwen3:32b", 27648, HELD)], id="held-plan"),
        pytest.param(state(loaded={"qwen3:8b": 6144}), [ticket("qwen3:8b", 6144, RUNNING)],
                     id="loaded-copy-not-counted-twice"),
        pytest.param(_two_runners(), [], id="two-runners-of-one-model"),
        pytest.param(_two_runners(), [ticket("qwen3:8b", 2048, LOADING)],
                     id="two-runners-and-a-load"),
    ],
)
async def test_the_page_shows_the_memory_the_planner_sees(
    kv: MemoryKV, clock: ManualClock, writers: Writers, doc: ProviderState,
    tickets: list[Ticket],
) -> None:
    await writers.put_state(doc)
    await writers.put_tickets("gpu-a", *tickets)
    view = FleetView(kv, clock=clock)
    await view.start()
    try:
        [p] = view.snapshot()["providers"]
    finally:
        await view.close()
    runtime = ProviderSnapshot.of_documents(doc, tickets, T0)
    assert runtime is not None and runtime.free_mib is not None
    assert p["residentMiB"] == runtime.resident_total
    assert p["loadingMiB"] == runtime.loading_mib
    assert p["freeMiB"] == max(0, runtime.free_mib)
