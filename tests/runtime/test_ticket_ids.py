"""Ticket ids: the text of a version-4 UUID made from the injected generator's bits."""

from __future__ import annotations

import random
import uuid

from hypothesis import given
from hypothesis import strategies as st

from kubemoot.clock import ManualClock
from kubemoot.runtime.tickets import TicketManager, ticket_id_of
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.state import GIB, NOW, provider_state


@given(st.integers(min_value=0, max_value=2**128 - 1))
def test_a_ticket_id_is_the_uuid_classs_text(bits: int) -> None:
    assert ticket_id_of(bits) == str(uuid.UUID(int=bits, version=4))


def test_the_edges_of_the_bits() -> None:
    for bits in (0, 2**128 - 1, 0xC000 << 48, 0xF000 << 64, 1, 2**127):
        assert ticket_id_of(bits) == str(uuid.UUID(int=bits, version=4))


async def test_a_seeded_manager_gives_the_ids_it_gave_before() -> None:
    """A seeded simulation repeats: the ids follow the generator as uuid.UUID's did."""
    clock = ManualClock(NOW)
    kv = MemoryKV(clock=clock)
    states, tickets = await kv.bucket("states"), await kv.bucket("tickets")
    await states.put(encode_token("gpu-a"), provider_state("gpu-a", usable_mib=16 * GIB).to_json())
    manager = TicketManager(tickets, states, clock=clock, rng=random.Random(7))
    granted = [await manager.claim("gpu-a", "m", GIB, f"h{i}") for i in range(3)]
    expected = random.Random(7)
    assert [t.ticket_id for t in granted] == [
        str(uuid.UUID(int=expected.getrandbits(128), version=4)) for _ in range(3)]
    await kv.close()
