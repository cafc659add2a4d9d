"""The ticket encoder writes the bytes pydantic writes, each ticket encoded once."""

from __future__ import annotations

import random

import pytest

from kubemoot.runtime.ticket_encoding import TicketEncoder
from kubemoot.store.documents import LineEntry, ProviderTickets, Ticket, TicketState


def _ticket(rng: random.Random, n: int) -> Ticket:
    evicts = {f"victim-{i}": rng.randrange(1, 9000) for i in range(rng.randrange(3))}
    return Ticket(
        ticket_id=f"t-{n}", model=rng.choice(("qwen3:8b", "llama3.1:8b", "ünï/côde")),
        model_footprint_mib=rng.randrange(0, 40_000), holder_id=f"crew/agent-{n}",
        state=rng.choice(list(TicketState)), started_at=1.7e9 + rng.random() * 1e4,
        expires_at=1.7e9 + rng.random() * 1e5, evicts=evicts,
        evicts_first=list(evicts)[:1] if evicts and rng.random() < 0.5 else None,
    )


@pytest.mark.parametrize("seed", range(5))
def test_the_encoder_writes_what_pydantic_writes(seed: int) -> None:
    rng = random.Random(seed)
    encoder = TicketEncoder("gpu-ä")
    tickets: list[Ticket] = []
    for n in range(300):
        action = rng.randrange(4)
        if action == 0 or not tickets:
            tickets.append(_ticket(rng, n))
        elif action == 1:
            del tickets[rng.randrange(len(tickets))]
        else:  # a renewal or state change: a copy in its place, as decide makes it
            i = rng.randrange(len(tickets))
            tickets[i] = tickets[i].model_copy(update={"expires_at": 1.8e9 + n})
        line = ([LineEntry(holder_id="h", footprint_mib=3, since=1.0, expires_at=2.5)]
                if rng.random() < 0.1 else [])
        served = {"t-0": 1.7e9 + 0.1} if rng.random() < 0.1 else {}
        document = ProviderTickets(provider="gpu-ä", tickets=list(tickets), line=line,
                                   served=served)
        assert encoder.encode(document) == document.to_json()


def test_another_providers_document_is_encoded_whole() -> None:
    rng = random.Random(1)
    document = ProviderTickets(provider="gpu-b", tickets=[_ticket(rng, 0)])
    assert TicketEncoder("gpu-a").encode(document) == document.to_json()


def test_an_empty_document_and_a_ticket_listed_twice() -> None:
    rng = random.Random(2)
    encoder = TicketEncoder("gpu-a")
    empty = ProviderTickets(provider="gpu-a")
    assert encoder.encode(empty) == empty.to_json()
    one = _ticket(rng, 0)
    twice = ProviderTickets(provider="gpu-a", tickets=[one, _ticket(rng, 1), one])
    assert encoder.encode(twice) == twice.to_json()
    assert encoder.encode(twice) == twice.to_json()  # every ticket known now

