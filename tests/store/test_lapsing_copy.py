"""A lapsing copy on both stores: the claim's own judgement, inside the compare-and-set.

A copy whose keep-alive ends before a call placed now would reach it is not warm, but
the engine holds its memory until the unload its expiry starts is done (DESIGN §5;
``live_state``). Judged as free, that memory went to a load, and the engine made room
for the load by evicting the copy on its own (the gateway bench's ``overcommits``).
"""

from __future__ import annotations

import pytest

from kubemoot.runtime.snapshot import EXPIRY_MARGIN_SECONDS, UNLOAD_GRACE_SECONDS
from kubemoot.runtime.tickets import ClaimRejected, TicketManager
from kubemoot.store.documents import ClaimCondition
from kubemoot.store.keys import encode_token
from kubemoot.testing.state import GIB, provider_state
from tests.store.conftest import StoreUnderTest
from tests.store.test_tickets import PROVIDER, setup


async def _lapsing(store: StoreUnderTest) -> tuple[TicketManager, float]:
    """A 10 GiB card holding 6 GiB of ``old``, idle, its keep-alive ending in 0.5 s."""
    manager, _, states = await setup(store, 10 * GIB)
    ends = store.clock.now() + EXPIRY_MARGIN_SECONDS / 2
    state = provider_state(PROVIDER, usable_mib=10 * GIB, loaded={"old": 6 * GIB})
    state.loaded_models[0].expires_at = ends
    await states.put(encode_token(PROVIDER), state.to_json())
    return manager, ends


async def test_a_load_is_not_granted_the_memory_of_a_copy_the_engine_still_holds(
        store: StoreUnderTest) -> None:
    manager, ends = await _lapsing(store)
    with pytest.raises(ClaimRejected, match="does not fit"):
        await manager.claim(PROVIDER, "new", 6 * GIB, "h1")
    # Once the unload its expiry started is done, the memory is back, with no new probe.
    await store.age(ends + UNLOAD_GRACE_SECONDS - store.clock.now() + 0.1)
    ticket = await manager.claim(PROVIDER, "new", 6 * GIB, "h1")
    assert ticket.model_footprint_mib == 6 * GIB


async def test_a_lapsing_copy_can_be_the_victim_that_makes_room(store: StoreUnderTest) -> None:
    # The runtime's own unload of it frees the memory sooner, as its expiry would.
    manager, _ = await _lapsing(store)
    ticket = await manager.claim(
        PROVIDER, "new", 6 * GIB, "h1", evicts={"old": 6 * GIB},
        condition=ClaimCondition(idle_victims=["old"]))
    assert ticket.evicts == {"old": 6 * GIB}


async def test_a_load_of_the_lapsing_model_itself_is_granted_the_copy_s_memory(
        store: StoreUnderTest) -> None:
    # The engine never holds both: it serves the call on the copy, or reloads it into
    # the memory the copy's unload frees.
    manager, _ = await _lapsing(store)
    ticket = await manager.claim(PROVIDER, "old", 6 * GIB, "h1")
    assert ticket.model_footprint_mib == 6 * GIB
    with pytest.raises(ClaimRejected, match="does not fit"):  # but only once
        await manager.claim(PROVIDER, "new", 6 * GIB, "h2")


async def test_a_lapsing_copy_planned_as_a_victim_gives_its_memory_to_that_plan_only(
        store: StoreUnderTest) -> None:
    manager, _ = await _lapsing(store)
    await manager.claim(PROVIDER, "new", 6 * GIB, "h1", evicts={"old": 6 * GIB},
                        condition=ClaimCondition(idle_victims=["old"]))
    with pytest.raises(ClaimRejected, match="does not fit"):  # not again for "old"
        await manager.claim(PROVIDER, "old", 6 * GIB, "h2")
