"""The pure decision of a batch of ticket operations (no store, no clock, no loop).

A card with 10000 MiB usable and nothing loaded; sizes are chosen so each outcome can be
checked by hand.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.runtime.ticket_decision import (
    CHECK_FAILED,
    LINE_AHEAD,
    NO_ROOM,
    WITHDRAWN,
    Decision,
    Gone,
    OpKind,
    Refused,
    TicketOp,
    decide,
)
from kubemoot.store.documents import (
    ClaimCondition,
    LineEntry,
    ProviderTickets,
    RequestKind,
    Ticket,
    TicketRequest,
    TicketState,
)
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


# -- requests announced by other processes (the claim line's entrance) ---------------


def _announced(ticket_id: str, mib: int, *, expires_at: float = NOW + 2,
               kind: RequestKind = RequestKind.CLAIM) -> TicketRequest:
    ticket = _ticket(ticket_id, mib) if kind is RequestKind.CLAIM else None
    return TicketRequest(provider="gpu", kind=kind, ticket_id=ticket_id, ticket=ticket,
                         expires_at=expires_at)


def test_announced_claims_go_before_the_batch_oldest_first() -> None:
    # Two claimers of other processes lost their races and announced; this process's
    # own claim came later. 6000 + 3000 fit, the newcomer's 2000 no longer does.
    announced = [_announced("a", 6000), _announced("b", 3000)]
    decision = decide(_doc(), STATE, NOW, [_claim("mine", 2000)],
                      line_seconds=LINE_SECONDS, announced=announced)
    assert [t.ticket_id for t in decision.tickets] == ["a", "b"]
    assert decision.outcomes == [Refused(NO_ROOM)]
    assert [r.ticket_id for r in decision.settled] == ["a", "b"]
    assert decision.served == {"a": NOW + 2, "b": NOW + 2}  # never granted twice
    # Without the announcements the newcomer's write would have won the memory.
    alone = decide(_doc(), STATE, NOW, [_claim("mine", 2000)], line_seconds=LINE_SECONDS)
    assert isinstance(alone.outcomes[0], Ticket)


def test_an_announced_claim_is_granted_once_even_after_its_release() -> None:
    first = decide(_doc(), STATE, NOW, [], line_seconds=LINE_SECONDS,
                   announced=[_announced("a", 6000)])
    doc = first.document("gpu")
    # Its holder released it; a writer whose view of the requests is late sees it still.
    released = decide(doc, STATE, NOW + 0.5, [TicketOp(OpKind.RELEASE, "a")],
                      line_seconds=LINE_SECONDS)
    late = decide(released.document("gpu"), STATE, NOW + 1, [], line_seconds=LINE_SECONDS,
                  announced=[_announced("a", 6000)])
    assert late.tickets == [] and not late.changed
    assert [r.ticket_id for r in late.found_settled] == ["a"] and late.settled == []


def test_an_announced_claim_that_does_not_fit_keeps_a_place_in_the_line() -> None:
    decision = decide(_doc(_ticket("big", 8000)), STATE, NOW, [], line_seconds=LINE_SECONDS,
                      announced=[_announced("waiter", 4000)])
    assert decision.settled == [] and decision.changed
    assert [(e.holder_id, e.footprint_mib) for e in decision.line] == [("waiter", 4000)]
    # "big" goes; the waiter's place promises it 4000, so a newcomer of 7000 waits.
    later = decide(_doc(line=tuple(decision.line)), STATE, NOW + 1, [_claim("new", 7000)],
                   line_seconds=LINE_SECONDS)
    assert later.outcomes == [Refused(LINE_AHEAD)]


def test_lapsed_announcements_and_marks_are_ignored_and_pruned() -> None:
    doc = ProviderTickets(provider="gpu", served={"old": NOW - 1, "young": NOW + 1})
    decision = decide(doc, STATE, NOW, [], line_seconds=LINE_SECONDS,
                      announced=[_announced("dead", 1000, expires_at=NOW)])
    assert decision.tickets == [] and decision.settled == []
    # dropped from what a write would carry, but no reason to write on their own
    assert decision.served == {"young": NOW + 1} and not decision.changed


def test_an_announced_release_and_a_withdrawn_claim() -> None:
    doc = _doc(_ticket("a", 1000))
    decision = decide(doc, STATE, NOW, [], line_seconds=LINE_SECONDS,
                      announced=[_announced("a", 0, kind=RequestKind.RELEASE)])
    assert decision.tickets == [] and [r.ticket_id for r in decision.settled] == ["a"]
    # A claimer that gave up on an announced claim withdraws it: marked served, so a
    # writer that still sees the announcement does not grant it afterwards.
    withdrawn = decide(_doc(), STATE, NOW, [TicketOp(OpKind.RELEASE, "b",
                                                     withdraw_until=NOW + 2)],
                       line_seconds=LINE_SECONDS)
    after = decide(withdrawn.document("gpu"), STATE, NOW + 1, [], line_seconds=LINE_SECONDS,
                   announced=[_announced("b", 1000)])
    assert after.tickets == []


def test_a_withdrawn_claim_taken_by_a_combiner_is_never_granted() -> None:
    # A combiner holds a claim another process sent it (it marks the claim served when
    # it grants it); meanwhile the sender gave up and withdrew it. The combiner's late
    # try must not grant it: the memory would be held for nobody until the TTL.
    withdrawn = decide(_doc(), STATE, NOW, [TicketOp(OpKind.RELEASE, "b",
                                                     withdraw_until=NOW + 2)],
                       line_seconds=LINE_SECONDS)
    late = TicketOp(OpKind.CLAIM, "b", ticket=_ticket("b", 1000), announced_until=NOW + 2)
    decision = decide(withdrawn.document("gpu"), STATE, NOW + 1, [late],
                      line_seconds=LINE_SECONDS)
    assert decision.outcomes == [Refused(WITHDRAWN)] and decision.tickets == []
    # Granted before the withdrawal came, it stays granted (and the release undoes it).
    granted = decide(_doc(), STATE, NOW, [late], line_seconds=LINE_SECONDS)
    again = decide(granted.document("gpu"), STATE, NOW + 1, [late],
                   line_seconds=LINE_SECONDS)
    assert [t.ticket_id for t in again.tickets] == ["b"]
    assert isinstance(again.outcomes[0], Ticket)


def test_a_document_written_before_the_line_and_the_marks_still_reads() -> None:
    old = (b'{"version": 1, "provider": "gpu", "tickets": [{"ticketId": "a", "model": "m",'
           b' "modelFootprintMiB": 1000, "holderId": "h", "state": "running",'
           b' "startedAt": 1.0, "expiresAt": 2000.0, "evicts": {}}]}')
    doc = ProviderTickets.from_json(old)
    assert doc.line == [] and doc.served == {}
    assert [t.ticket_id for t in decide(doc, STATE, NOW, [], line_seconds=LINE_SECONDS,
                                        announced=[_announced("b", 1000)]).tickets] == [
        "a", "b"]


@settings(max_examples=200, deadline=None)
@given(
    held=st.lists(st.integers(0, 6000), max_size=3),
    announced=st.lists(st.integers(1, 6000), max_size=8),
    mine=st.lists(st.integers(0, 6000), max_size=4),
)
def test_announced_claims_never_overcommit_and_are_served_first_come(
        held: list[int], announced: list[int], mine: list[int]) -> None:
    doc = _doc(*(_ticket(f"h{i}", mib) for i, mib in enumerate(held)))
    requests = [_announced(f"a{i}", mib) for i, mib in enumerate(announced)]
    decision = decide(doc, STATE, NOW, [_claim(f"m{i}", mib) for i, mib in enumerate(mine)],
                      line_seconds=LINE_SECONDS, announced=requests)
    new = [t for t in decision.tickets if not t.ticket_id.startswith("h")]
    assert sum(t.model_footprint_mib for t in new) <= max(0, 10000 - sum(held))
    # First come: the first announced claim left waiting is promised all that is left,
    # so nothing after it (announced later, or this process's own) takes any memory.
    granted = [t.ticket_id for t in new]
    order = [r.ticket_id for r in requests] + [f"m{i}" for i in range(len(mine))]
    waiting = next((i for i, r in enumerate(requests) if r.ticket_id not in granted), None)
    if waiting is not None:
        later = [t for t in new if order.index(t.ticket_id) > waiting]
        assert all(t.model_footprint_mib == 0 for t in later)


def test_an_announced_claims_condition_is_judged_by_the_writer() -> None:
    # Another process's unload plan: "old" must still be resident and idle. The writer
    # judges that on the documents it writes, as the claimer's own write would have.
    state = provider_state("gpu", usable_mib=10000, loaded={"old": 4000})
    plan = _ticket("plan", 4000).model_copy(update={"evicts": {"old": 4000}})
    request = TicketRequest(provider="gpu", kind=RequestKind.CLAIM, ticket_id="plan",
                            ticket=plan, expires_at=NOW + 2,
                            condition=ClaimCondition(idle_victims=["old"]))
    busy = _ticket("user", 0).model_copy(update={"model": "old"})  # someone uses "old"
    refused = decide(_doc(busy), state, NOW, [], line_seconds=LINE_SECONDS,
                     announced=[request])
    assert [t.ticket_id for t in refused.tickets] == ["user"]
    assert refused.settled == [] and refused.line == []  # not a wait for memory
    granted = decide(_doc(), state, NOW, [], line_seconds=LINE_SECONDS, announced=[request])
    assert [(t.ticket_id, t.evicts_first) for t in granted.tickets] == [("plan", ["old"])]
    # A second plan sharing the victim is granted too (they share its memory) but does
    # not report the eviction: the first plan's ticket does.
    second = _claim("second", 0).ticket
    assert second is not None
    shared = decide(granted.document("gpu"), state, NOW, [TicketOp(
        OpKind.CLAIM, "second", ticket=second.model_copy(update={"evicts": {"old": 4000}}),
        condition=ClaimCondition(idle_victims=["old"]))], line_seconds=LINE_SECONDS)
    outcome = shared.outcomes[0]
    assert isinstance(outcome, Ticket) and outcome.evicts_first == []


@pytest.mark.parametrize(
    ("condition", "granted"),
    [
        pytest.param(ClaimCondition(prompt_tokens=100), True, id="context-holds"),
        pytest.param(ClaimCondition(prompt_tokens=9000), False, id="context-too-small"),
        pytest.param(ClaimCondition(warm=True), False, id="no-copy"),
    ],
)
def test_a_claims_condition_is_data(condition: ClaimCondition, granted: bool) -> None:
    state = provider_state("gpu", usable_mib=10000, context=8192)
    op = TicketOp(OpKind.CLAIM, "t", ticket=_ticket("t", 1000), condition=condition)
    decision = decide(_doc(), state, NOW, [op], line_seconds=LINE_SECONDS)
    assert isinstance(decision.outcomes[0], Ticket) is granted
    if not granted:
        assert decision.outcomes == [Refused(CHECK_FAILED)]


# -- a claim judged on the snapshot its option was priced on ---------------------------


def _judged_with(doc: ProviderTickets, priced: ProviderSnapshot,
                 mib: int = 1000) -> tuple[list[ProviderSnapshot], Decision]:
    seen: list[ProviderSnapshot] = []

    def check(p: ProviderSnapshot) -> bool:
        seen.append(p)
        return True

    # A cold load of a model with no copy there: one whose model has a copy is refused
    # before its check (conditions.holds: the copy that is coming serves it).
    claim = _claim("new", mib)
    assert claim.ticket is not None
    op = claim._replace(ticket=claim.ticket.model_copy(update={"model": "n"}), check=check,
                        snapshot=priced, condition=ClaimCondition(prompt_tokens=10))
    return seen, decide(doc, STATE, NOW, [op], line_seconds=LINE_SECONDS)


def test_a_claim_is_judged_on_the_snapshot_it_was_priced_on_when_it_is_the_same() -> None:
    held = [_ticket("a", 3000), _ticket("gone", 1000, expires_at=NOW - 1)]
    doc = _doc(*held)
    priced = ProviderSnapshot(STATE, (held[0],))  # the live tickets, the same objects
    seen, decision = _judged_with(doc, priced)
    assert seen == [priced] and seen[0] is priced
    _, plain = _judged_with(doc, None)  # type: ignore[arg-type]
    assert decision == plain


@pytest.mark.parametrize("why", ["other-tickets", "equal-copies", "circuit", "state"])
def test_a_claim_on_other_documents_is_judged_on_the_documents(why: str) -> None:
    held = _ticket("a", 3000)
    doc = _doc(held)
    priced = {
        "other-tickets": ProviderSnapshot(STATE, ()),
        "equal-copies": ProviderSnapshot(STATE, (held.model_copy(),)),
        "circuit": ProviderSnapshot(STATE, (held,), circuit_open=True),
        "state": ProviderSnapshot(STATE.model_copy(), (held,)),
    }[why]
    for mib in (1000, 7001):  # granted; refused for memory
        seen, decision = _judged_with(doc, priced, mib)
        assert all(p is not priced for p in seen)
        _, plain = _judged_with(doc, None, mib)  # type: ignore[arg-type]
        assert decision == plain
