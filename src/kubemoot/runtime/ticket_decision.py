"""What a batch of ticket operations does to one provider's ticket document: pure.

:class:`~kubemoot.runtime.tickets.TicketManager` reads the document (and the provider
state a claim is judged on), asks :func:`decide` what the queued operations make of it,
and writes the outcome with one compare-and-set. Everything between the read and the
write is here, as a function of values: no store, no clock, no I/O — the
import-linter contract that keeps pricing pure covers this module too. A refusal is
data (:class:`Refused`, :class:`Gone`); the manager turns it into an exception.

The rules, in arrival order:

* **claim** — granted when the ticket's footprint fits the provider's headroom (counting
  the victims it plans to unload) *and* the memory is not promised to claimers in the
  provider's line before it, and when its condition (data) and its check (code) hold;
  a claim refused for memory
  takes a place in the line (or keeps it) so memory freed later drains to it first. A
  claim whose ticket is already present was granted by a write whose acknowledgement
  was lost: granted again, not added twice. A granted ticket that plans victims is
  told which of them no earlier live ticket planned (``evictsFirst``).
* **release** — the ticket goes; an absent one is already released.
* **renew**, **state** — the ticket's expiry moves to now + its TTL (and a state change
  sets the state); an absent ticket is :class:`Gone`.

Before the batch, the requests other processes *announced* after losing a race (see
:class:`~kubemoot.store.documents.TicketRequest`) are applied in the order they were
announced: an announced claim is granted when it fits beside the line's promises, its
condition holds (:mod:`kubemoot.runtime.conditions`), and it was not served before (it
is then marked ``served`` until its announcement lapses, so a writer with a late view
never grants it twice); one that does not fit takes its place in the line, as a
refused claim does, and one whose condition fails is left alone; either way its
claimer hears "no" on its own next decision. An announced release removes its ticket.
Announced requests were waiting before anything in the batch, which is why they go
first.

Expired tickets, lapsed places in the line and lapsed ``served`` marks are pruned by
every decision that writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from kubemoot.runtime.budget import fits
from kubemoot.runtime.conditions import holds
from kubemoot.runtime.snapshot import ProviderSnapshot, live_state
from kubemoot.store.documents import (
    ClaimCondition,
    LineEntry,
    ProviderState,
    ProviderTickets,
    RequestKind,
    Ticket,
    TicketRequest,
    TicketState,
)

__all__ = [
    "CHECK_FAILED",
    "LINE_AHEAD",
    "NO_ROOM",
    "WITHDRAWN",
    "Check",
    "Decision",
    "Gone",
    "OpKind",
    "Outcome",
    "Refused",
    "TicketOp",
    "decide",
]

Check = Callable[[ProviderSnapshot], bool]
"""An extra condition a claim must meet against the same read (e.g. victims still idle).

It sees the provider as the claim is deciding on it (its state and active tickets); a
claim on a provider without a state fails its check.
"""

NO_ROOM = "does not fit the provider's VRAM budget"
LINE_AHEAD = "the memory is promised to claimers in line before it"
CHECK_FAILED = "the claim's check failed"
WITHDRAWN = "its claimer withdrew it"


class OpKind(Enum):
    CLAIM = "claim"
    RELEASE = "release"
    RENEW = "renew"
    STATE = "state"


# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read under callgrind, a module global about
# 150): the members read once or more per operation are kept at module level.
_CLAIM, _RELEASE, _STATE = OpKind.CLAIM, OpKind.RELEASE, OpKind.STATE
_REQUEST_RELEASE = RequestKind.RELEASE


class TicketOp(NamedTuple):
    """One queued operation, as the decision sees it (a tuple: one is made per queued
    operation on every try, and a frozen dataclass sets its ten fields one by one)."""

    kind: OpKind
    ticket_id: str
    ticket: Ticket | None = None  # CLAIM: the ticket to add
    check: Check | None = None  # CLAIM: code, judged only by the claimer's process
    condition: ClaimCondition | None = None  # CLAIM: data, judged by any writer
    ttl_seconds: float = 0.0  # RENEW and STATE: the expiry moves to now + this
    state: TicketState | None = None  # STATE
    abandoned: bool = False  # CLAIM: nobody waits for it any more
    # CLAIM that was announced: once granted, its ticket id stays marked served until
    # then, so the announcement is never granted (again) by another writer.
    announced_until: float | None = None
    # RELEASE that withdraws an announced claim its caller gave up on: marked served
    # until then, so no writer grants the announcement afterwards.
    withdraw_until: float | None = None
    # CLAIM: the provider as the caller priced it (its round's snapshot). When the
    # decision sees the same state and the very same live tickets, it judges the claim
    # on that snapshot, whose derived figures are already worked out, instead of
    # making one of the documents (see :func:`_judged_on`).
    snapshot: ProviderSnapshot | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """A claim the budget, the line or its check says no to (not a race)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Gone:
    """A renewal or state change of a ticket that is no longer there."""


Outcome = Ticket | Refused | Gone | None
"""Per operation: the ticket granted or changed, a refusal, or None (released, or an
abandoned claim that was skipped)."""


class Decision(NamedTuple):
    """The document's next tickets, line and served marks, whether that is a change to
    write, each operation's outcome (in the order of the operations), the announced
    requests this decision applies (granted, or released), and those it found applied
    already (by an earlier write). A tuple: one is made per batch decided."""

    tickets: list[Ticket]
    line: list[LineEntry]
    changed: bool
    outcomes: list[Outcome]
    served: dict[str, float]
    settled: list[TicketRequest]
    found_settled: list[TicketRequest]

    def document(self, provider: str) -> ProviderTickets:
        """The ticket document to write."""
        return ProviderTickets(provider=provider, tickets=self.tickets, line=self.line,
                               served=self.served)


def decide(doc: ProviderTickets, state: ProviderState | None, now: float,
           ops: Sequence[TicketOp], *, line_seconds: float,
           announced: Sequence[TicketRequest] = ()) -> Decision:
    """Decide every operation in order against ``doc`` and ``state`` at ``now``.

    ``line_seconds`` is how long a claimer refused for memory keeps its place in the
    line after its last try. ``announced``: the requests other processes announced for
    this provider, in the order they were announced; they are applied first.
    """
    # (Every write decides: an empty line or served map is copied without a
    # comprehension, and the tickets are doc.active(now) without the call.)
    # (The document's fields are read once: a pydantic model's every attribute read
    # goes through the slot hook its __getattr__ puts on the class.)
    doc_tickets, doc_line, doc_served = doc.tickets, doc.line, doc.served
    tickets = [t for t in doc_tickets if t.expires_at > now]
    line = [entry for entry in doc_line if entry.expires_at > now] if doc_line else []
    served = ({tid: until for tid, until in doc_served.items() if until > now}
              if doc_served else {})
    # Writers prune expired tickets, lapsed places in the line and lapsed marks. Marks
    # lapse all the time under contention (one per announced claim granted) and are
    # harmless once lapsed, so they are dropped whenever a write happens but never
    # make one: otherwise every decision would have to win a write to give any answer.
    changed = len(tickets) != len(doc_tickets) or (
        len(line) != len(doc_line) if doc_line else False)  # (no line: none lapsed)
    settled: list[TicketRequest] = []
    found_settled: list[TicketRequest] = []
    for request in announced:
        done, wrote = _apply_announced(request, state, tickets, line, served, now,
                                       line_seconds)
        if done:
            (settled if wrote else found_settled).append(request)
        changed = changed or wrote
    outcomes: list[Outcome] = []
    for op in ops:
        index = None  # where its ticket is, if it is (a loop: no generator per operation)
        for i, t in enumerate(tickets):
            if t.ticket_id == op.ticket_id:
                index = i
                break
        if op.kind is _CLAIM:
            assert op.ticket is not None
            if index is not None:  # granted by a write whose acknowledgement was lost
                outcomes.append(tickets[index])
                continue
            if op.abandoned:
                outcomes.append(None)  # nobody is waiting for it any more
                continue
            if op.announced_until is not None and op.ticket_id in served:
                # Marked served yet absent: its claimer gave up on it and withdrew it
                # (a combiner's late try of a claim sent to it, say). Never granted now.
                outcomes.append(Refused(WITHDRAWN))
                continue
            reason, ceiling = _refusal(state, tickets, line, now, op.ticket, op.check,
                                       op.condition, op.snapshot)
            if reason is not None:
                outcomes.append(Refused(reason))
                changed = _keep_place(line, now, op.ticket, ceiling, line_seconds) or changed
                continue
            granted = _grant(op.ticket, tickets, line)
            if op.announced_until is not None:
                served[op.ticket_id] = op.announced_until
            outcomes.append(granted)
            changed = True
        elif op.kind is _RELEASE:
            if index is not None:
                del tickets[index]
                changed = True
            if op.withdraw_until is not None and op.withdraw_until > now:
                # a claim announced and then given up: no late grant of its announcement
                changed = changed or op.ticket_id not in served
                served.setdefault(op.ticket_id, op.withdraw_until)
            outcomes.append(None)
        elif index is None:
            outcomes.append(Gone())
        else:
            current = tickets[index]
            update: dict[str, object] = {"expires_at": now + op.ttl_seconds}
            if op.kind is _STATE:
                update["state"] = op.state
            tickets[index] = current.model_copy(update=update)
            outcomes.append(tickets[index])
            changed = True
    return Decision(tickets, line, changed, outcomes, served, settled, found_settled)


def _grant(ticket: Ticket, tickets: list[Ticket], line: list[LineEntry]) -> Ticket:
    """Add the ticket (out of the line); the ticket as granted."""
    if ticket.evicts:
        # Two plans may share a victim; the one whose ticket came first reports it.
        planned = {v for t in tickets for v in t.evicts}
        first = [v for v in ticket.evicts if v not in planned]
        if first != ticket.evicts_first:
            ticket = ticket.model_copy(update={"evicts_first": first})
    tickets.append(ticket)
    kept = [e for e in line if e.holder_id != ticket.holder_id]
    if len(kept) != len(line):
        line[:] = kept  # served: out of the line
    return ticket


def _apply_announced(
    request: TicketRequest,
    state: ProviderState | None,
    tickets: list[Ticket],
    line: list[LineEntry],
    served: dict[str, float],
    now: float,
    line_seconds: float,
) -> tuple[bool, bool]:
    """Apply one announced request; (settled, changed the document)."""
    present = any(t.ticket_id == request.ticket_id for t in tickets)
    if request.kind is _REQUEST_RELEASE:
        if not present:
            return True, False
        tickets[:] = [t for t in tickets if t.ticket_id != request.ticket_id]
        return True, True
    if present or request.ticket_id in served:
        return True, False  # granted already (and perhaps released since)
    if request.expires_at <= now or request.ticket is None:
        return False, False  # lapsed: its claimer decides it itself
    reason, ceiling = _refusal(state, tickets, line, now, request.ticket, None,
                               request.condition)
    if reason is not None:
        # Not now: it keeps a place in the line like any claimer refused for memory,
        # so what is freed later goes to it first; its claimer hears "no" itself.
        return False, _keep_place(line, now, request.ticket, ceiling, line_seconds)
    _grant(request.ticket, tickets, line)
    served[request.ticket_id] = request.expires_at
    return True, True


def _refusal(
    state: ProviderState | None,
    tickets: list[Ticket],
    line: list[LineEntry],
    now: float,
    ticket: Ticket,
    check: Check | None,
    condition: ClaimCondition | None,
    priced: ProviderSnapshot | None = None,
) -> tuple[str | None, int | None]:
    """Why the claim cannot be granted (None: it can), and the provider's ceiling for
    it (what it could ever free; None when a refusal is no wait for memory). The
    provider's headroom is counted once per claim."""
    footprint = ticket.model_footprint_mib
    if footprint <= 0 and check is None and condition is None:
        return None, None  # spends nothing and asks nothing: nothing to judge
    p = _judged_on(state, tickets, now, priced)
    headroom = ceiling = None
    if p is not None and footprint > 0:
        headroom = p.headroom_mib(ticket.evicts, ticket.model)
        ceiling = p.ceiling_mib(ticket.evicts, ticket.model)
    reason = None
    if not fits(footprint, headroom):
        reason = NO_ROOM
    else:
        ahead = _reserved_ahead(line, ticket, headroom, ceiling)
        if ahead and not fits(footprint + ahead, headroom):
            reason = LINE_AHEAD
    if reason is None:
        if condition is not None and not holds(condition, p, ticket.model):
            return CHECK_FAILED, None
        if check is not None and (p is None or not check(p)):
            return CHECK_FAILED, None  # not a wait for memory: no place in the line
        return None, ceiling
    return reason, ceiling


def _judged_on(state: ProviderState | None, tickets: list[Ticket], now: float,
               priced: ProviderSnapshot | None) -> ProviderSnapshot | None:
    """The provider as the claim is judged: ``ProviderSnapshot.of_documents(state,
    tickets, now)``, or ``priced`` when that is the same provider — the same state
    object once lapsed copies are dropped, the same ticket objects live at ``now`` in
    the same order, and no open circuit (the only figure of a snapshot the claim's
    judgement reads that the documents do not give). Every answer the judgement asks
    for (headroom, ceiling, copies, contexts, planned victims, free slots) is then the
    same, and ``priced`` has most of them worked out already: the placement round that
    priced the option asked for them."""
    if state is None:
        return None
    active = tuple([t for t in tickets if t.expires_at > now])  # one call, not a generator's
    live = live_state(state, now, {t.model for t in active})
    if (priced is not None and priced.state is live and not priced.circuit_open
            and len(priced.tickets) == len(active)):
        for a, b in zip(priced.tickets, active, strict=True):  # all(a is b ...), as a loop
            if a is not b:
                break
        else:
            return priced
    return ProviderSnapshot(state=live, tickets=active)


def _keep_place(line: list[LineEntry], now: float, ticket: Ticket, ceiling: int | None,
                line_seconds: float) -> bool:
    """Put a claimer refused for memory in the line, or keep its place; changed?"""
    if ticket.model_footprint_mib <= 0:
        return False
    if ceiling is None or ticket.model_footprint_mib > ceiling:
        return False  # it could never be served here: it holds nobody up
    for i, entry in enumerate(line):
        if entry.holder_id != ticket.holder_id:
            continue
        if entry.expires_at - now >= line_seconds / 2:
            return False  # fresh enough: a refusal then costs no write
        line[i] = entry.model_copy(update={
            "expires_at": now + line_seconds,
            "footprint_mib": ticket.model_footprint_mib,
        })
        return True
    line.append(LineEntry(holder_id=ticket.holder_id,
                          footprint_mib=ticket.model_footprint_mib, since=now,
                          expires_at=now + line_seconds))
    return True


def _reserved_ahead(
    line: list[LineEntry], ticket: Ticket, headroom: int | None, ceiling: int | None
) -> int:
    """Memory promised to claimers in line before this one (all of them if not in line).

    In line order, each earlier claimer is promised what it wants out of the headroom
    left; the first one that does not fully fit is promised all that is left, so memory
    freed later drains to it rather than to claims that came after it. A claimer that
    wants more than the provider could ever free (``ceiling``) holds nobody up.
    """
    if ticket.model_footprint_mib <= 0 or ceiling is None or headroom is None:
        return 0
    reserved = 0
    for entry in line:
        if entry.holder_id == ticket.holder_id:
            break
        if entry.footprint_mib > ceiling:
            continue
        promised = min(entry.footprint_mib, max(0, headroom - reserved))
        reserved += promised
        if promised < entry.footprint_mib:
            break  # the line stops at the first claimer still waiting for memory
    return reserved
