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
  provider's line before it, and when its own check holds; a claim refused for memory
  takes a place in the line (or keeps it) so memory freed later drains to it first. A
  claim whose ticket is already present was granted by a write whose acknowledgement
  was lost: granted again, not added twice.
* **release** — the ticket goes; an absent one is already released.
* **renew**, **state** — the ticket's expiry moves to now + its TTL (and a state change
  sets the state); an absent ticket is :class:`Gone`.

Expired tickets and lapsed places in the line are pruned by every decision that writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from kubemoot.runtime.budget import fits
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.store.documents import (
    LineEntry,
    ProviderState,
    ProviderTickets,
    Ticket,
    TicketState,
)

__all__ = [
    "CHECK_FAILED",
    "LINE_AHEAD",
    "NO_ROOM",
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


class OpKind(Enum):
    CLAIM = "claim"
    RELEASE = "release"
    RENEW = "renew"
    STATE = "state"


@dataclass(frozen=True, slots=True)
class TicketOp:
    """One queued operation, as the decision sees it."""

    kind: OpKind
    ticket_id: str
    ticket: Ticket | None = None  # CLAIM: the ticket to add
    check: Check | None = None  # CLAIM
    ttl_seconds: float = 0.0  # RENEW and STATE: the expiry moves to now + this
    state: TicketState | None = None  # STATE
    abandoned: bool = False  # CLAIM: nobody waits for it any more


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


@dataclass(frozen=True, slots=True)
class Decision:
    """The document's next tickets and line, whether that is a change to write, and
    each operation's outcome (in the order of the operations)."""

    tickets: list[Ticket]
    line: list[LineEntry]
    changed: bool
    outcomes: list[Outcome]


def decide(doc: ProviderTickets, state: ProviderState | None, now: float,
           ops: Sequence[TicketOp], *, line_seconds: float) -> Decision:
    """Decide every operation in order against ``doc`` and ``state`` at ``now``.

    ``line_seconds`` is how long a claimer refused for memory keeps its place in the
    line after its last try.
    """
    tickets = doc.active(now)
    line = [entry for entry in doc.line if entry.expires_at > now]
    # Writers prune expired tickets and lapsed places in the line.
    changed = len(tickets) != len(doc.tickets) or len(line) != len(doc.line)
    outcomes: list[Outcome] = []
    for op in ops:
        index = next((i for i, t in enumerate(tickets) if t.ticket_id == op.ticket_id), None)
        if op.kind is OpKind.CLAIM:
            assert op.ticket is not None
            if index is not None:  # granted by a write whose acknowledgement was lost
                outcomes.append(tickets[index])
                continue
            if op.abandoned:
                outcomes.append(None)  # nobody is waiting for it any more
                continue
            reason, line_changed = _refusal(state, tickets, line, now, op, line_seconds)
            if reason is not None:
                outcomes.append(Refused(reason))
                changed = line_changed or changed
                continue
            tickets.append(op.ticket)
            outcomes.append(op.ticket)
            changed = True
            kept = [e for e in line if e.holder_id != op.ticket.holder_id]
            if len(kept) != len(line):
                line[:] = kept  # served: out of the line
        elif op.kind is OpKind.RELEASE:
            if index is not None:
                del tickets[index]
                changed = True
            outcomes.append(None)
        elif index is None:
            outcomes.append(Gone())
        else:
            current = tickets[index]
            update: dict[str, object] = {"expires_at": now + op.ttl_seconds}
            if op.kind is OpKind.STATE:
                update["state"] = op.state
            tickets[index] = current.model_copy(update=update)
            outcomes.append(tickets[index])
            changed = True
    return Decision(tickets, line, changed, outcomes)


def _refusal(
    state: ProviderState | None,
    tickets: list[Ticket],
    line: list[LineEntry],
    now: float,
    op: TicketOp,
    line_seconds: float,
) -> tuple[str | None, bool]:
    """Why the claim cannot be granted (None: it can), and whether a refusal for
    memory changed the line. The provider's headroom is counted once per claim."""
    ticket = op.ticket
    assert ticket is not None
    footprint = ticket.model_footprint_mib
    if footprint <= 0 and op.check is None:
        return None, False  # spends nothing and asks nothing: nothing to judge
    p = ProviderSnapshot.of_documents(state, tickets, now)
    headroom = ceiling = None
    if p is not None and footprint > 0:
        headroom = p.headroom_mib(ticket.evicts)
        ceiling = p.ceiling_mib(ticket.evicts)
    reason = None
    if not fits(footprint, headroom):
        reason = NO_ROOM
    else:
        ahead = _reserved_ahead(line, ticket, headroom, ceiling)
        if ahead and not fits(footprint + ahead, headroom):
            reason = LINE_AHEAD
    if reason is None:
        if op.check is not None and (p is None or not op.check(p)):
            return CHECK_FAILED, False
        return None, False
    return reason, _keep_place(line, now, ticket, ceiling, line_seconds)


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
