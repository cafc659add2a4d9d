"""A provider's ticket document encoded for its compare-and-set, each ticket once.

Every write of a ticket document encodes the whole document, and between two writes
of one provider most tickets are the same objects: a claim adds one, a release drops
one, a state change or renewal replaces one (:func:`~kubemoot.runtime.ticket_decision.decide`
copies a ticket it changes, and nothing changes a ticket in place). So the encoder keeps
each ticket's JSON from the write before, keyed by the ticket object, and joins them
between the document's head and tail. The bytes are those of
:meth:`~kubemoot.store.documents.ProviderTickets.to_json`, which encodes every document
with a line or served marks (rare outside contention) and every other provider's.
"""

from __future__ import annotations

from kubemoot.store.documents import DOCUMENT_VERSION, ProviderTickets, Ticket

__all__ = ["TicketEncoder"]

_TICKETS = b'"tickets":['


class TicketEncoder:
    """Encodes the ticket documents of one provider."""

    __slots__ = ("_fragments", "_head", "_provider", "_tail")

    def __init__(self, provider: str) -> None:
        self._provider = provider
        # The document without tickets, as pydantic writes it, cut where they go.
        empty = ProviderTickets(provider=provider).to_json()
        head, found, tail = empty.partition(_TICKETS)
        assert found and tail.startswith(b"]"), empty
        self._head, self._tail = head + _TICKETS, tail
        # id of a ticket of the last document encoded → (the ticket, its JSON); the
        # ticket is held so that its id is not reused by another while it is kept
        self._fragments: dict[int, tuple[Ticket, bytes]] = {}

    def encode(self, document: ProviderTickets) -> bytes:
        """``document.to_json()``, each ticket encoded only if the last document lacked it."""
        if (document.line or document.served or document.provider != self._provider
                or document.version != DOCUMENT_VERSION):
            self._fragments = {}
            return document.to_json()
        known = self._fragments
        kept: dict[int, tuple[Ticket, bytes]] = {}
        parts: list[bytes] = []
        for ticket in document.tickets:
            ident = id(ticket)  # once, and the look-up without a call
            if ident not in known or (held := known[ident])[0] is not ticket:
                held = (ticket, ticket.model_dump_json(by_alias=True, exclude_none=True)
                        .encode("utf-8"))
            kept[ident] = held
            parts.append(held[1])
        self._fragments = kept
        return self._head + b",".join(parts) + self._tail
