"""kubemoot.testing.state: the one home of provider-state and ticket builders."""

from __future__ import annotations

import pytest

from kubemoot.settings import DEFAULTS
from kubemoot.store.documents import TicketState
from kubemoot.testing.state import GIB, NOW, gpu, provider_state, ticket


def test_gib_and_mib_forms_build_the_same_document() -> None:
    assert gpu("a", 24, residents={"m": 12}, slots=2) == provider_state(
        "a", total_mib=24 * GIB, loaded={"m": 12 * GIB}, slots=2
    )


def test_usable_adds_the_default_reserve_and_excludes_a_total() -> None:
    state = provider_state("a", usable_mib=8 * GIB)
    assert state.total_vram_mib == 8 * GIB + DEFAULTS.reserve_mib
    assert state.reserve_mib == DEFAULTS.reserve_mib
    with pytest.raises(ValueError, match="total_mib or usable_mib"):
        provider_state("a", total_mib=1, usable_mib=1)


def test_ticket_times_sizes_and_ids() -> None:
    t = ticket("m", age=5, footprint_gib=2, evicts={"v": 1}, state=TicketState.LOADING)
    assert (t.started_at, t.expires_at) == (NOW - 5, NOW + DEFAULTS.ticket_ttl_seconds)
    assert (t.model_footprint_mib, t.evicts) == (2 * GIB, {"v": GIB})
    assert ticket("m", footprint_mib=300).model_footprint_mib == 300
    # tickets that differ get different default ids (a ticket document keys on them)
    assert ticket("m", evicts={"a": 1}).ticket_id != ticket("m", evicts={"b": 1}).ticket_id
