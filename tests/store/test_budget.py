"""The fit decision shared by the ticket manager, the runtime and the simulator."""

from __future__ import annotations

import pytest

from kubemoot.runtime.budget import budget_allows, headroom_mib
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.store.documents import ProviderState, Ticket, TicketState
from kubemoot.testing.state import GIB, NOW, provider_state
from kubemoot.testing.state import ticket as ticket_of


def state(usable_gib: int | None, resident: dict[str, int] | None = None) -> ProviderState:
    return provider_state(
        "p",
        usable_mib=None if usable_gib is None else usable_gib * GIB,
        loaded={m: g * GIB for m, g in (resident or {}).items()},
    )


def ticket(
    model: str, gib: int, *, evicts: dict[str, int] | None = None, ttl_seconds: float = 60.0
) -> Ticket:
    return ticket_of(model, footprint_gib=gib, evicts=evicts, state=TicketState.LOADING,
                     age=1.0, ttl_seconds=ttl_seconds, holder_id="h")


# usable is always the first argument of state() in GiB (the reserve is added on top)
@pytest.mark.parametrize(
    ("name", "provider", "tickets", "footprint_gib", "evicts", "allowed"),
    [
        ("empty card fits", state(24), [], 24, None, True),
        ("one MiB too many", state(24), [], 25, None, False),
        ("resident models take room", state(24, {"a": 20}), [], 5, None, False),
        ("a loading ticket takes room", state(24), [ticket("x", 20)], 5, None, False),
        ("a loaded ticket is counted once, by residency",
         state(24, {"x": 20}), [ticket("x", 20)], 4, None, True),
        ("an expired ticket takes no room",
         state(24), [ticket("x", 20, ttl_seconds=0.0)], 24, None, True),
        ("own victim gives credit", state(24, {"v": 20}), [], 20, {"v": 20}, True),
        ("victim credit is counted once across tickets",
         state(24, {"v": 20}), [ticket("x", 20, evicts={"v": 20})], 20, {"v": 20}, False),
        ("another ticket's victim is credited to the budget",
         state(24, {"v": 20}), [ticket("x", 10, evicts={"v": 20})], 10, None, True),
        ("a victim no longer resident gives no credit",
         state(24), [ticket("x", 20, evicts={"v": 20})], 5, {"v": 20}, False),
        ("unknown total allows nothing that spends memory", state(None), [], 1, None, False),
        ("no state allows nothing that spends memory", None, [], 1, None, False),
        ("footprint zero always fits", state(24, {"a": 24}), [ticket("x", 30)], 0, None, True),
        ("footprint zero fits an unknown total", state(None), [], 0, None, True),
    ],
)
def test_budget_allows(
    name: str,
    provider: ProviderState | None,
    tickets: list[Ticket],
    footprint_gib: int,
    evicts: dict[str, int] | None,
    allowed: bool,
) -> None:
    evicts_mib = {v: g * GIB for v, g in (evicts or {}).items()}
    assert budget_allows(
        provider, tickets, NOW, footprint_mib=footprint_gib * GIB, evicts=evicts_mib
    ) is allowed, name


def test_parts_of_the_budget() -> None:
    provider = state(24, {"v": 8, "x": 4})
    tickets = [
        ticket("y", 6, evicts={"v": 8}),
        ticket("z", 2, evicts={"v": 8, "gone": 3}),
        ticket("x", 4),  # x is resident already
    ]
    p = ProviderSnapshot.of_documents(provider, tickets, NOW)
    assert p is not None
    assert p.loading_mib == 8 * GIB  # committed: y and z, whose models are not resident
    assert p.credit_mib(p.planned_victims()) == 8 * GIB  # v once; "gone" is not resident
    assert headroom_mib(provider, tickets, NOW) == (24 - 12 + 8 - 8) * GIB
    assert headroom_mib(state(None), tickets, NOW) is None
