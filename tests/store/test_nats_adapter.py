"""The NATS adapter's own shortcuts past nats-py answer what nats-py answers.

The store parses message headers, reads a delivery's revision and publishes a
compare-and-set with less Python work than nats-py's own paths; these tests hold each
shortcut to nats-py's answer (the store contract in ``test_contract.py`` covers the
operations themselves).
"""

from __future__ import annotations

import nats.aio.client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from kubemoot.settings import NatsSettings
from kubemoot.store.nats import NatsKV, _Client, _parse_header_lines, _stream_sequence
from kubemoot.store.protocol import RevisionMismatch, StoreError, StoreUnavailable

_nats_py_parse = nats.aio.client.Client._parse_header_lines

# Header names and values made of the characters that decide how a line parses:
# whitespace of every kind nats-py checks (ASCII's and others), colons, non-ASCII.
_PIECES = st.text(
    alphabet=st.sampled_from([
        *"Nats-Expected-Last-Subject-Sequence: 0123456789",
        "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\r", "\n", "\xa0", "é", "\u2003", ":",
    ]),
    max_size=40,
)


@given(st.lists(st.tuples(_PIECES, _PIECES, st.booleans()), max_size=6))
def test_header_lines_parse_as_nats_py_parses_them(lines: list[tuple[str, str, bool]]) -> None:
    raw = b"\r\n".join(
        (name.encode() + b":" + value.encode()) if colon else name.encode()
        for name, value, colon in lines
    ) + b"\r\n\r\n"
    assert _parse_header_lines(raw) == _nats_py_parse(raw)


@given(st.binary(max_size=200))
def test_any_bytes_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert _parse_header_lines(raw) == _nats_py_parse(raw)


def test_a_compare_and_set_header_block_parses_to_its_one_header() -> None:
    raw = b"Nats-Expected-Last-Subject-Sequence: 41\r\n\r\n"
    assert _parse_header_lines(raw) == {"Nats-Expected-Last-Subject-Sequence": "41"}


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.KV_tickets.abc123.1.57.3.1700000000000000000.0",  # no domain
        "$JS.ACK.hub.4f2a.KV_tickets.abc123.1.57.3.1700000000000000000.0.tok",  # domain
        "$JS.ACK._.4f2a.KV_tickets.abc123.1.912.3.1700000000000000000.5.tok.x",  # more
    ],
)
def test_a_deliverys_revision_is_the_stream_sequence_nats_py_reads(reply: str) -> None:
    msg = Msg(_client=None, subject="$KV.tickets.k", reply=reply)  # type: ignore[arg-type]
    assert _stream_sequence(msg) == msg.metadata.sequence.stream


async def test_the_connection_parses_headers_with_the_adapters_parser(nats_url: str) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        assert isinstance(kv.connection, _Client)
        assert kv.connection._parse_header_lines is _parse_header_lines
    finally:
        await kv.close()


async def test_an_update_answers_with_the_revision_a_watch_delivers(nats_url: str) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_revisions")
        first = await bucket.put("k", b"one")
        watch = bucket.watch()
        await watch.ready()
        second = await bucket.update("k", b"two", expected_revision=first)
        change = await watch.__anext__()
        assert (change.key, change.value, change.revision) == ("k", b"two", second)
        with pytest.raises(RevisionMismatch):
            await bucket.update("k", b"three", expected_revision=first)
        await watch.aclose()
    finally:
        await kv.close()


async def test_an_update_of_a_key_nats_refuses_is_a_store_error(nats_url: str) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_keys")
        for key in ("", ".k", "k.", "a key", "k*"):
            with pytest.raises(StoreError):
                await bucket.update(key, b"v", expected_revision=1)
    finally:
        await kv.close()


async def test_an_update_with_no_stream_left_is_unavailable(nats_url: str) -> None:
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_gone")
        revision = await bucket.put("k", b"one")
        await kv.connection.jetstream().delete_stream("KV_adapter_gone")
        with pytest.raises(StoreUnavailable):
            await bucket.update("k", b"two", expected_revision=revision)
    finally:
        await kv.close()
