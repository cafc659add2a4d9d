"""Handing ticket operations to the process that writes a provider's document for all.

The claim line's announcements (:mod:`kubemoot.runtime.ticket_requests`) reach every
process that follows the requests bucket, and every ticket document written reaches
every process that follows the ticket bucket. With one claimer per process (every agent
pod is one) and twenty processes on one card, that made about forty messages per granted
claim that each woke a Python process (``bench/kv.py --count-requests``: 1.5
announcements and half a document revision per claim, each delivered to twenty
processes), and those wake-ups, not the server, used up the two cores.

So under contention one process *combines* for a provider: it listens on the bus
subject :func:`subject` (in a queue group), takes the operations other processes send
it there, queues each in arrival order, writes them in one compare-and-set as any
writer does, and replies to each sender with its outcome. Its own operations take the
same way (they queue behind the ones that came first). A sender wakes for its reply
only; nobody follows the others' announcements or the writer's documents for it.

Who combines: a lane that lost a race, or wrote moments ago (a busy one), asks on the
subject first; when nobody listens, a lane that lost a race starts listening. Those that
start together hold a roll call and all but the lowest rank stop. A combiner stops when
its lane has been idle for ``combine_idle_seconds``, and when it loses a race (someone
else writes: a process that lost no race, or one it cannot outpace). When it stops, what
it took goes back to the senders, and what it had announced stays in the line.

The budget rules do not change: the combiner decides every operation against the
document at the revision its write is conditional on, exactly as for its own. A sender
that hears nothing in time (the combiner went away) or gets its operations back decides
them itself, as announced ones: they keep their turn while their request lives, and a
claim it then gives up on is withdrawn (marked served) so that a late write of the
combiner cannot grant it. A combiner never applies a request after its ``expiresAt``,
nor a claim whose ticket is marked served and absent.

This module holds the wire format of the replies and the subject; the lanes are
:mod:`kubemoot.runtime.tickets`'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kubemoot.store.documents import Ticket
from kubemoot.store.keys import encode_token

__all__ = [
    "CONFLICT",
    "GONE",
    "GRANTED",
    "LAPSED",
    "QUEUE",
    "REFUSED",
    "RELEASED",
    "UNAVAILABLE",
    "Reply",
    "decode_replies",
    "encode_replies",
    "subject",
]

GRANTED = "granted"
REFUSED = "refused"
RELEASED = "released"
GONE = "gone"
CONFLICT = "conflict"
UNAVAILABLE = "unavailable"
# Not decided by the combiner (the request lapsed, was withdrawn, or the combiner failed
# it for a reason of its own): the sender decides the operation itself.
LAPSED = "lapsed"

#: The queue group every combiner listens in: one of them takes each request.
QUEUE = "kubemoot-tickets"


def subject(provider: str) -> str:
    """Where operations on ``provider`` go to its combiner."""
    return f"kubemoot.tickets.{encode_token(provider)}"


@dataclass(frozen=True, slots=True)
class Reply:
    """One operation's outcome as the combiner sends it back."""

    ticket_id: str
    result: str
    ticket: Ticket | None = None  # GRANTED
    reason: str = ""  # REFUSED, CONFLICT, UNAVAILABLE, LAPSED
    # A revision of the provider's document that shows the outcome (the combiner's
    # write, or a newer one it knew of); 0: not known (a combiner of a version that
    # sends none). The sender's provider view skips watch deliveries older than it: this
    # process did not write that revision, so nothing else tells the view of it.
    revision: int = 0


def encode_replies(replies: list[Reply]) -> bytes:
    return json.dumps([
        {"ticketId": r.ticket_id, "result": r.result, "reason": r.reason,
         "revision": r.revision,
         **({"ticket": r.ticket.model_dump(mode="json", by_alias=True)}
            if r.ticket is not None else {})}
        for r in replies
    ]).encode()


def decode_replies(data: bytes) -> list[Reply]:
    """The replies; ``ValueError`` when ``data`` is not a list of them."""
    try:
        raw = json.loads(data)
        return [
            Reply(ticket_id=str(item["ticketId"]), result=str(item["result"]),
                  reason=str(item.get("reason", "")),
                  revision=int(item.get("revision", 0)),
                  ticket=(Ticket.model_validate(item["ticket"]) if "ticket" in item
                          else None))
            for item in raw
        ]
    except (KeyError, TypeError) as error:
        raise ValueError(f"not a combiner's reply: {error}") from error
