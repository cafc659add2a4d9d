"""Residency is a lease with an end (DESIGN §5): a copy past its engine keep-alive is
not warm, and a call for it books the model's whole footprint as a cold load."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from kubemoot.runtime.placement import Action
from kubemoot.runtime.snapshot import EXPIRY_MARGIN_SECONDS, ProviderSnapshot
from kubemoot.store.documents import ProviderState
from kubemoot.testing.state import GIB, NOW, provider_state
from tests.runtime.builders import Harness

MiB = int(4 * GIB)


def _expiring(expires_at: float | None) -> ProviderState:
    state = provider_state("gpu-a", usable_mib=10000, loaded={"m": MiB})
    copies = [c.model_copy(update={"expires_at": expires_at}) for c in state.loaded_models]
    return state.model_copy(update={"loaded_models": copies})


@pytest.mark.parametrize(("expires_in", "resident"), [
    pytest.param(None, True, id="no-expiry-shown"),
    pytest.param(30.0, True, id="well-ahead"),
    pytest.param(EXPIRY_MARGIN_SECONDS / 2, False, id="ends-before-the-call-arrives"),
    pytest.param(-1.0, False, id="already-passed"),
])
def test_a_copy_counts_as_resident_only_until_its_keep_alive_ends(
        expires_in: float | None, resident: bool) -> None:
    state = _expiring(None if expires_in is None else NOW + expires_in)
    p = ProviderSnapshot.of_documents(state, (), NOW)
    assert p is not None
    assert p.is_resident("m") is resident
    assert p.free_mib == 10000 - (MiB if resident else 0)


async def test_after_the_engine_let_a_copy_go_the_next_call_is_a_cold_load_of_full_size(
        make: Callable[..., Awaitable[Harness]]) -> None:
    h = await make([_expiring(NOW + 30)], declared={"m": 4})
    first = await h.place("m")
    assert first.action is Action.WARM
    assert first.ticket is not None and first.ticket.model_footprint_mib == 0
    await h.tickets.release("gpu-a", first.ticket.ticket_id)
    # the published state is unchanged (no probe since), but the engine's timer ran out
    h.clock.advance(30)
    second = await h.place("m")
    assert second.action is Action.COLD_LOAD
    assert second.ticket is not None and second.ticket.model_footprint_mib == MiB
