"""Residency is a lease with an end (DESIGN §5): a copy past its engine keep-alive is
not warm, and a call for it books the model's whole footprint as a cold load."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from kubemoot.runtime.placement import Action
from kubemoot.runtime.snapshot import (
    EXPIRY_MARGIN_SECONDS,
    UNLOAD_GRACE_SECONDS,
    ProviderSnapshot,
    live_state,
    next_expiry,
)
from kubemoot.store.documents import ProviderState, ResidentModel
from kubemoot.testing.state import GIB, NOW, provider_state, ticket
from tests.runtime.builders import Harness

MiB = int(4 * GIB)


def _expiring(expires_at: float | None) -> ProviderState:
    state = provider_state("gpu-a", usable_mib=10000, loaded={"m": MiB})
    copies = [c.model_copy(update={"expires_at": expires_at}) for c in state.loaded_models]
    return state.model_copy(update={"loaded_models": copies})


@pytest.mark.parametrize(("expires_in", "warm", "held"), [
    pytest.param(None, True, True, id="no-expiry-shown"),
    pytest.param(30.0, True, True, id="well-ahead"),
    pytest.param(EXPIRY_MARGIN_SECONDS / 2, False, True, id="ends-before-the-call-arrives"),
    pytest.param(-UNLOAD_GRACE_SECONDS / 2, False, True, id="ended-its-unload-under-way"),
    pytest.param(-UNLOAD_GRACE_SECONDS - 0.5, False, False, id="ended-and-unloaded"),
])
def test_a_copy_is_warm_until_its_keep_alive_nears_its_end_and_held_until_unloaded(
        expires_in: float | None, warm: bool, held: bool) -> None:
    state = _expiring(None if expires_in is None else NOW + expires_in)
    p = ProviderSnapshot.of_documents(state, (), NOW)
    assert p is not None
    assert (p.is_resident("m"), p.has_copy("m")) == (warm, warm)
    # the engine frees the memory only when the unload its expiry starts is done
    assert p.holds("m") is held
    assert p.free_mib == 10000 - (MiB if held else 0)


def test_the_view_is_rebuilt_when_a_copy_stops_being_warm_and_when_its_memory_returns(
        ) -> None:
    ends = NOW + 30
    warm = live_state(_expiring(ends), NOW)
    assert next_expiry(warm) == ends - EXPIRY_MARGIN_SECONDS
    lapsing = live_state(_expiring(ends), ends - EXPIRY_MARGIN_SECONDS)
    assert next_expiry(lapsing) == ends + UNLOAD_GRACE_SECONDS
    # a call on the copy keeps it warm: the engine renews its keep-alive after the call
    busy = ProviderSnapshot.of_documents(_expiring(NOW + 0.5), (ticket("m"),), NOW)
    assert busy is not None and busy.is_resident("m")


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


async def test_a_load_beside_a_lapsing_copy_plans_its_unload_instead_of_taking_its_memory(
        make: Callable[..., Awaitable[Harness]]) -> None:
    # 4 GiB of m in its last half second: the engine still holds them, and 8 GiB more do
    # not fit beside them. Counted free, the load went to the engine as it was, which
    # made room by evicting the idle m on its own (an overcommit of the runtime's).
    h = await make([_expiring(NOW + EXPIRY_MARGIN_SECONDS / 2)], declared={"m": 4, "big": 8})
    placed = await h.place("big")
    assert placed.action is Action.UNLOAD
    assert placed.ticket is not None and placed.ticket.evicts == {"m": MiB}


async def test_a_call_for_the_lapsing_model_itself_loads_it_in_the_copy_s_place(
        make: Callable[..., Awaitable[Harness]]) -> None:
    # m's copy is lapsing beside x, which a call holds: 1,808 MiB are free besides both.
    # The engine serves the call on m's copy while it has it, or reloads m into the
    # memory the copy's unload frees, never holding both: the call books m in full, and
    # once booked the copy is the call's (warm again), so nothing is counted twice.
    state = _expiring(NOW + EXPIRY_MARGIN_SECONDS / 2)
    state.loaded_models.append(ResidentModel(name="x", size_mib=MiB))
    h = await make([state], tickets={"gpu-a": [ticket("x")]}, declared={"m": 4, "x": 4})
    placed = await h.place("m")
    assert placed.action is Action.COLD_LOAD
    assert placed.ticket is not None
    assert (placed.ticket.model_footprint_mib, placed.ticket.evicts) == (MiB, {})
    p = (await h.view.snapshot()).provider("gpu-a")
    assert p is not None and p.is_resident("m") and p.free_mib == 10000 - 2 * MiB
