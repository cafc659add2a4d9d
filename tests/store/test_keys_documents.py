"""KV-safe key tokens and the typed documents of the three buckets."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.store.documents import (
    DemandEntry,
    ProviderState,
    ProviderTickets,
    ResidentModel,
    SelectionEntry,
    Ticket,
    TicketState,
)
from kubemoot.store.keys import decode_token, encode_token, join_key

NATS_KEY_SEGMENT = re.compile(r"[A-Za-z0-9_=-]+")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips_through_a_token(text: str) -> None:
    token = encode_token(text)
    assert NATS_KEY_SEGMENT.fullmatch(token)
    assert decode_token(token) == text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=1), min_size=1, max_size=4))
def test_joined_keys_split_back_into_their_segments(segments: list[str]) -> None:
    key = join_key(*segments)
    assert [decode_token(part) for part in key.split(".")] == segments


@pytest.mark.parametrize(
    ("raw", "token"),
    [
        ("qwen3:32b", "qwen3=3A32b"),
        ("crew-a/kubectl-agent", "crew-a=2Fkubectl-agent"),
        ("llama3.1", "llama3=2E1"),
        ("a=b", "a=3Db"),
        ("", "="),
    ],
)
def test_design_examples(raw: str, token: str) -> None:
    assert encode_token(raw) == token


@pytest.mark.parametrize("bad", ["a=4", "a=zz", "a b", "a.b"])
def test_malformed_tokens_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_token(bad)


def sample_state() -> ProviderState:
    return ProviderState(
        provider="gpu-a",
        endpoint="http://gpu-a:11434",
        ready=True,
        last_probed_at=1_700_000_000.5,
        total_vram_mib=24576,
        reserve_mib=1024,
        max_parallel=2,
        context_length=8192,
        loaded_models=[ResidentModel(name="qwen3:14b", size_mib=12288, digest="sha256:ab")],
        loaded_model_footprints={"qwen3:14b": 12288},
    )


def sample_tickets() -> ProviderTickets:
    ticket = Ticket(
        ticket_id="t-1",
        model="qwen3:8b",
        model_footprint_mib=6144,
        holder_id="crew-a/agent-1",
        state=TicketState.LOADING,
        started_at=10.0,
        expires_at=190.0,
        evicts={"qwen3:14b": 12288},
    )
    return ProviderTickets(provider="gpu-a", tickets=[ticket])


@pytest.mark.parametrize(
    ("document", "wire_fields"),
    [
        (sample_state(), {"totalVramMiB", "reserveMiB", "loadedModels", "lastProbedAt",
                          "loadedModelFootprints", "maxParallel", "contextLength"}),
        (sample_tickets(), {"tickets", "provider", "version"}),
        (DemandEntry(expires_at=5.0, count=2.5, last_used_at=1.0), {"expiresAt", "lastUsedAt"}),
        (SelectionEntry(expires_at=5.0, models=["a"], frequency=0.5),
         {"expiresAt", "models", "frequency"}),
    ],
    ids=["state", "tickets", "demand", "selection"],
)
def test_documents_round_trip_with_design_field_names(
    document: ProviderState | ProviderTickets | DemandEntry | SelectionEntry,
    wire_fields: set[str],
) -> None:
    data = document.to_json()
    assert wire_fields <= set(json.loads(data))
    assert type(document).from_json(data) == document


def test_ticket_wire_fields_follow_the_design() -> None:
    wire = json.loads(sample_tickets().to_json())["tickets"][0]
    assert set(wire) == {"ticketId", "model", "modelFootprintMiB", "holderId", "state",
                         "startedAt", "expiresAt", "evicts"}
    assert wire["state"] == "loading"


def test_readers_ignore_expired_tickets() -> None:
    tickets = sample_tickets()
    assert [t.ticket_id for t in tickets.active(189.9)] == ["t-1"]
    assert tickets.active(190.0) == []
