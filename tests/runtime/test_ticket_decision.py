"""The pure decision of a batch of ticket operations (no store, no clock, no loop).

A card with 10000 MiB usable and nothing loaded; sizes are chosen so each outcome can be
checked by hand.
"""

from __future__ import annotations

import pytest

from kubemoot.runtime.ticket_decision import (
    LINE_AHEAD,
    NO_ROOM,
    Gone,
    OpKind,
    Refused,
    TicketOp,
    decide,
)
from kubemoot.store.documents import LineEntry, ProviderTickets, Ticket, TicketState
from kubemoot.testing.state import provider_state

NOW = 1000.0
STATE = provider_state("gpu", usable_mib=10000)
LINE_SECONDS = 5.0


def _ticket(ticket_id: str, mib: int, *, holder: str | None = None,
            expires_at: float = NOW + 60) -> Ticket:
    return Ticket(ticket_id=ticket_id, model="m", model_footprint_mib=mib,
                  holder_id=holder or ticket_id, state=TicketState.RUNNING,
                  started_at=NOW - 1, expires_at=expires_at)


def _claim(ticket_id: str, mib: int, **kw: object) -> TicketOp:
    return TicketOp(OpKind.CLAIM, ticket_id, ticket=_ticket(ticket_id, mib, **kw))  # type: ignore[arg-type]


def _doc(*tickets: Ticket, line: tuple[LineEntry, ...] = ()) -> ProviderTickets:
    return ProviderTickets(provider="gpu", tickets=list(tickets), line=list(line))


@pytest.mark.parametrize(
    ("held", "claims", "outcomes"),
    [
        pytest.param([], [6000, 4000], ["t0", "t1"], id="both-fit-exactly"),
        pytest.param([], [6000, 4001], ["t0", NO_ROOM], id="one-MiB-too-many"),
        pytest.param([7000], [3000, 1], ["t0", NO_ROOM], id="held-ticket-counts"),
        pytest.param([], [0, 0], ["t0", "t1"], id="warm-copies-spend-nothing"),
    ],
)
def test_claims_are_decided_in_order_against_what_the_earlier_ones_left(
        held: list[int], claims: list[int], outcomes: list[str]) -> None:
    doc = _doc(*(_ticket(f"held{i}", mib) for i, mib in enumerate(held)))
    decision = decide(doc, STATE, NOW, [_claim(f"t{i}", mib) for i, mib in enumerate(claims)],
                      line_seconds=LINE_SECONDS)
    seen = [o.ticket_id if isinstance(o, Ticket) else o.reason if isinstance(o, Refused)
            else o for o in decision.outcomes]
    assert seen == outcomes
    assert decision.changed == any(isinstance(o, Ticket) for o in decision.outcomes)


def test_a_claim_refused_for_memory_takes_a_place_that_later_claims_respect() -> None:
    first = decide(_doc(_ticket("big", 8000)), STATE, NOW, [_claim("waiter", 4000)],
                   line_seconds=LINE_SECONDS)
    assert first.outcomes == [Refused(NO_ROOM)]
    assert [(e.holder_id, e.footprint_mib, e.expires_at) for e in first.line] == [
        ("waiter", 4000, NOW + LINE_SECONDS)]
    # "big" is released; a newcomer of 7000 would fit the 10000 but 4000 are promised to
    # the waiter ahead of it: 7000 + 4000 > 10000. The waiter then gets its memory.
    doc = _doc(line=tuple(first.line))
    second = decide(doc, STATE, NOW + 1, [_claim("newcomer", 7000), _claim("waiter", 4000)],
                    line_seconds=LINE_SECONDS)
    assert second.outcomes[0] == Refused(LINE_AHEAD)
    assert isinstance(second.outcomes[1], Ticket)
    assert [e.holder_id for e in second.line] == ["newcomer"]  # the waiter left the line


def test_releases_renewals_and_state_changes() -> None:
    doc = _doc(_ticket("a", 1000), _ticket("b", 1000), _ticket("old", 1000, expires_at=NOW))
    decision = decide(doc, STATE, NOW, [
        TicketOp(OpKind.RELEASE, "a"),
        TicketOp(OpKind.RELEASE, "never-there"),
        TicketOp(OpKind.RENEW, "b", ttl_seconds=600.0),
        TicketOp(OpKind.STATE, "b", ttl_seconds=60.0, state=TicketState.LOADING),
        TicketOp(OpKind.RENEW, "a", ttl_seconds=600.0),  # released just before
    ], line_seconds=LINE_SECONDS)
    assert decision.outcomes[:2] == [None, None]
    renewed, changed, gone = decision.outcomes[2:]
    assert isinstance(renewed, Ticket) and renewed.expires_at == NOW + 600
    assert isinstance(changed, Ticket) and changed.state is TicketState.LOADING
    assert changed.expires_at == NOW + 60
    assert gone == Gone()
    # the expired ticket is pruned, "a" is gone: only "b" is written
    assert [t.ticket_id for t in decision.tickets] == ["b"] and decision.changed


def test_deciding_twice_is_deciding_once() -> None:
    """A write whose acknowledgement was lost is decided again: the claim already in the
    document is granted, not added twice, and nothing changes."""
    once = decide(_doc(), STATE, NOW, [_claim("t", 3000)], line_seconds=LINE_SECONDS)
    again = decide(_doc(*once.tickets), STATE, NOW, [_claim("t", 3000)],
                   line_seconds=LINE_SECONDS)
    assert again.outcomes == once.outcomes and not again.changed
    assert [t.ticket_id for t in again.tickets] == ["t"]


def test_an_abandoned_claim_is_skipped() -> None:
    op = TicketOp(OpKind.CLAIM, "t", ticket=_ticket("t", 1000), abandoned=True)
    decision = decide(_doc(), STATE, NOW, [op], line_seconds=LINE_SECONDS)
    assert decision.outcomes == [None] and decision.tickets == [] and not decision.changed
