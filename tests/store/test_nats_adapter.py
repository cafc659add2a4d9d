"""The NATS adapter's own shortcuts past nats-py answer what nats-py answers.

The store parses message headers, reads a delivery's revision, publishes a
compare-and-set and hands a watch its messages with less Python work than nats-py's own
paths; these tests hold each shortcut to nats-py's answer (the store contract in
``test_contract.py`` covers the operations themselves).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import nats.aio.client
import nats.aio.transport
import nats.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from kubemoot import metrics
from kubemoot.settings import NatsSettings
from kubemoot.store import nats as nats_store
from kubemoot.store.nats import NatsKV, _Client, _parse_header_lines, _stream_sequence
from kubemoot.store.protocol import Change, RevisionMismatch, StoreError, StoreUnavailable
from kubemoot.testing.nats_server import NatsServer
from kubemoot.testing.waiting import wait_until

# nats-py parses header lines with this method from 2.15 on (before, with the email
# package, and our override of it is then simply not called): compared where it exists.
_nats_py_parse = getattr(nats.aio.client.Client, "_parse_header_lines", None)
_same_parser = pytest.mark.skipif(
    _nats_py_parse is None, reason="this nats-py has no _parse_header_lines to compare with")

# Header names and values made of the characters that decide how a line parses:
# whitespace of every kind nats-py checks (ASCII's and others), colons, non-ASCII.
_PIECES = st.text(
    alphabet=st.sampled_from([
        *"Nats-Expected-Last-Subject-Sequence: 0123456789",
        "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\r", "\n", "\xa0", "é", "\u2003", ":",
    ]),
    max_size=40,
)


@_same_parser
@given(st.lists(st.tuples(_PIECES, _PIECES, st.booleans()), max_size=6))
def test_header_lines_parse_as_nats_py_parses_them(lines: list[tuple[str, str, bool]]) -> None:
    raw = b"\r\n".join(
        (name.encode() + b":" + value.encode()) if colon else name.encode()
        for name, value, colon in lines
    ) + b"\r\n\r\n"
    assert _parse_header_lines(raw) == _nats_py_parse(raw)


@_same_parser
@given(st.binary(max_size=200))
def test_any_bytes_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert _parse_header_lines(raw) == _nats_py_parse(raw)


def test_a_compare_and_set_header_block_parses_to_its_one_header() -> None:
    raw = b"Nats-Expected-Last-Subject-Sequence: 41\r\n\r\n"
    assert _parse_header_lines(raw) == {"Nats-Expected-Last-Subject-Sequence": "41"}


@_same_parser
@pytest.mark.parametrize("raw", [
    b"Nats-Expected-Last-Subject-Sequence: 0\r\n\r\n",
    b"Nats-Expected-Last-Subject-Sequence: 18446744073709551615\r\n\r\n",
    b"Nats-Expected-Last-Subject-Sequence:  7 \r\n\r\n",
    b"Nats-Expected-Last-Subject-Sequence: 7\r\n",
    b"Nats-Expected-Last-Subject-Sequence: 7\r\nKV-Operation: DEL\r\n\r\n",
    b"Nats-Expected-Last-Subject-Sequence: \xd9\xa3\r\n\r\n",
    b"Nats-Expected-Last-Subject-Sequence: 7\r\n\r\nX: y\r\n\r\n",
    b"nats-expected-last-subject-sequence: 7\r\n\r\n",
])
def test_the_compare_and_set_block_and_its_neighbours_parse_as_nats_py_parses_them(
    raw: bytes,
) -> None:
    assert _parse_header_lines(raw) == _nats_py_parse(raw)


def test_a_compare_and_set_block_is_read_with_two_calls() -> None:
    """The block nearly every watched delivery carries: one match and one decode,
    where the line-by-line parse makes a dozen calls."""
    calls: list[str] = []

    def tally(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            calls.append(event)

    raw = b"Nats-Expected-Last-Subject-Sequence: 41\r\n\r\n"
    sys.setprofile(tally)
    try:
        parsed = _parse_header_lines(raw)
    finally:
        sys.setprofile(None)
    assert parsed == {"Nats-Expected-Last-Subject-Sequence": "41"}
    assert len(calls) <= 4  # the parser itself, the match, the decode (and setprofile)


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


def _watch_subscriptions(kv: NatsKV) -> list[Any]:
    """nats-py's subscriptions of the store's watches (the JetStream ones)."""
    return [sub for sub in kv.connection._subs.values() if sub._jsi is not None]


async def test_a_watch_takes_its_messages_as_they_are_read(nats_url: str) -> None:
    """No task of the subscription's own wakes per message: the watch has each change
    as soon as the read loop has parsed it, and every change in order."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_inline")
        watch = bucket.watch()
        await watch.ready()
        [sub] = _watch_subscriptions(kv)
        await asyncio.sleep(0)  # the stopped task finishes its cancellation
        assert sub._wait_for_msgs_task.done()
        revisions = [await bucket.put(f"k{i}", b"v%d" % i) for i in range(20)]
        changes = [await asyncio.wait_for(watch.__anext__(), 5) for _ in revisions]
        assert [(c.key, c.value, c.revision) for c in changes] == [
            (f"k{i}", b"v%d" % i, revision) for i, revision in enumerate(revisions)
        ]
        assert sub.pending_msgs == 0 and sub.pending_bytes == 0
        await watch.aclose()
    finally:
        await kv.close()


async def test_a_write_while_a_watch_is_set_up_reaches_the_watch(
    nats_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process writes after the watch read the stream's last revision and
    before its consumer exists: the watch still delivers that write (it was lost, the
    consumer starting at the "new" messages of the moment it was made). Each write has
    a key of its own: a bucket keeps one revision a key, so a later write of the same
    key may stand in for an earlier one the watch had not yet been sent."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    other = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_window")
        theirs = await other.bucket("adapter_window")
        before = await theirs.put("a", b"before")
        js = bucket._js
        read_info = js.stream_info
        written: list[int] = []

        async def info_then_their_write(*args: Any, **kwargs: Any) -> Any:
            info = await read_info(*args, **kwargs)
            written.append(await theirs.put("b", b"between"))
            return info

        monkeypatch.setattr(js, "stream_info", info_then_their_write)
        watch = bucket.watch()
        await watch.ready()
        monkeypatch.undo()
        after = await theirs.put("c", b"after")
        changes = [await asyncio.wait_for(watch.__anext__(), 5) for _ in range(2)]
        assert [(c.key, c.value, c.revision) for c in changes] == [
            ("b", b"between", written[0]), ("c", b"after", after)]
        assert before < written[0] < after
        await watch.aclose()
    finally:
        await other.close()
        await kv.close()


async def test_a_watch_keeps_up_with_a_burst_past_flow_control(nats_url: str) -> None:
    """Enough bytes at once for the server to ask for flow control (the ordered
    consumer stalls until it is answered): every change still arrives, in order."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_burst")
        watch = bucket.watch()
        await watch.ready()
        value = b"x" * 65536
        revisions = await asyncio.gather(*(bucket.put(f"k{i}", value) for i in range(300)))
        changes = [await asyncio.wait_for(watch.__anext__(), 10) for _ in revisions]
        assert [c.revision for c in changes] == sorted(revisions)
        await watch.aclose()
    finally:
        await kv.close()


def _survived_bugs() -> float:
    labels = {"component": "store", "operation": "watch", "kind": metrics.BUG}
    value = metrics.REGISTRY.get_sample_value("kubemoot_errors_survived_total", labels)
    return 0.0 if value is None else value


async def test_a_delivery_that_fails_is_counted_and_the_watch_goes_on(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure while a watch takes a message is said and counted where it happens,
    and the connection goes on reading: the next change arrives."""

    def change(bucket: str, key: str, value: bytes | None, revision: int) -> Change:
        if key == "bad":
            raise RuntimeError("no change for this one")
        return Change(bucket, key, value, revision)

    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_failing")
        watch = bucket.watch()
        await watch.ready()
        monkeypatch.setattr(nats_store, "Change", change)
        before = _survived_bugs()
        with caplog.at_level(logging.WARNING, logger="kubemoot.store.nats"):
            await bucket.put("bad", b"1")
            good = await bucket.put("good", b"2")
            after = await asyncio.wait_for(watch.__anext__(), 5)
        assert (after.key, after.revision) == ("good", good)
        assert _survived_bugs() == before + 1
        assert any("a delivery to the watch of adapter_failing failed" in r.getMessage()
                   for r in caplog.records)
        await watch.aclose()
    finally:
        await kv.close()


async def test_a_compare_and_set_hears_its_ack_on_the_stores_own_inbox(
    nats_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not through nats-py's request (its shared reply subscription and wait_for): the
    store's own inbox, with the same answers, a lost race included."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_acks")
        first = await bucket.put("k", b"one")

        async def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError("a compare-and-set went through nats-py's request")

        monkeypatch.setattr(kv.connection, "request", refused)
        second = await bucket.update("k", b"two", expected_revision=first)
        assert second > first
        with pytest.raises(RevisionMismatch):
            await bucket.update("k", b"three", expected_revision=first)
        assert kv._acks is not None and kv._acks._waiting == {}
    finally:
        await kv.close()


async def test_a_compare_and_set_nobody_answers_in_time_is_unavailable(nats_url: str) -> None:
    """A subscriber that never replies stands where the stream was: the write gives up
    after the request timeout, as nats-py's request does, and leaves nothing waiting."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url], request_timeout=0.3))
    try:
        bucket = await kv.bucket("adapter_silent")
        revision = await bucket.put("k", b"one")
        await kv.connection.jetstream().delete_stream("KV_adapter_silent")
        silent = await kv.connection.subscribe("$KV.adapter_silent.k")
        with pytest.raises(StoreUnavailable):
            await bucket.update("k", b"two", expected_revision=revision)
        assert kv._acks is not None and kv._acks._waiting == {}
        await silent.unsubscribe()
    finally:
        await kv.close()


async def test_after_a_new_connection_compare_and_sets_hear_their_acks_on_it(
    nats: NatsServer,
) -> None:
    """nats-py gave up and the store built a connection anew: its writes' acks come to
    an inbox of the new connection."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats.url], reconnect_wait=0.2,
                                           max_reconnect_attempts=1, request_timeout=2.0))
    try:
        bucket = await kv.bucket("adapter_rebuilt")
        revision = await bucket.put("k", b"one")
        await nats.stop()
        await wait_until(lambda: kv.rebuilds == 0 and kv.connection.is_closed, timeout=60,
                         what="nats-py giving up on its connection")
        await nats.start()
        await wait_until(lambda: kv.rebuilds == 1, timeout=60,
                         what="the store connecting anew")
        assert kv._acks is not None and kv._acks.connection is kv.connection
        current = await bucket.get("k")
        assert current is not None and current.revision == revision
        assert await bucket.update("k", b"two", expected_revision=revision) > revision
    finally:
        await kv.close()


async def test_a_compare_and_set_is_written_in_its_own_turn(
    nats_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not queued for nats-py's flusher task (a loop turn later): the store writes the
    command to the socket itself, and the server takes it as nats-py's own."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_direct")
        first = await bucket.put("k", b"one")

        async def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError("a compare-and-set went through nats-py's publish")

        monkeypatch.setattr(kv.connection, "publish", refused)
        sent = kv.connection.stats["out_msgs"]
        second = await bucket.update("k", b"two", expected_revision=first)
        with pytest.raises(RevisionMismatch):
            await bucket.update("k", b"three", expected_revision=first)
        assert kv.connection.stats["out_msgs"] == sent + 2
        monkeypatch.undo()
        entry = await bucket.get("k")
        assert entry is not None and (entry.value, entry.revision) == (b"two", second)
    finally:
        await kv.close()


async def test_a_compare_and_set_waits_behind_commands_queued_for_the_flusher(
    nats_url: str,
) -> None:
    """With a command already queued for nats-py's flusher, a compare-and-set goes
    through nats-py's publish behind it: the server sees them in the order given."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_queued")
        first = await bucket.put("k", b"one")
        connection = kv.connection
        assert isinstance(connection, _Client)
        # a plain publish queued and not yet flushed (the flusher wakes next turn)
        await connection.publish("$KV.adapter_queued.k", b"queued")
        assert connection._pending_data_size > 0
        assert not connection.publish_now("$KV.adapter_queued.k", "_INBOX.x", b"v",
                                          {"Nats-Expected-Last-Subject-Sequence": "1"})
        # the compare-and-set names the first revision: it must reach the server after
        # the queued publish, so it loses the race
        with pytest.raises(RevisionMismatch):
            await bucket.update("k", b"two", expected_revision=first)
        entry = await bucket.get("k")
        assert entry is not None and entry.value == b"queued"
    finally:
        await kv.close()


@pytest.mark.parametrize("headers", [
    {"Nats-Expected-Last-Subject-Sequence": "0"},
    {"Nats-Expected-Last-Subject-Sequence": "18446744073709551615", "KV-Operation": "DEL"},
    {},
])
async def test_the_direct_publish_sends_nats_pys_bytes(headers: dict[str, str]) -> None:
    """The command written directly is the one nats-py's publish queues."""
    written: list[bytes] = []

    class Writer:
        transport = type("T", (), {"get_write_buffer_size": lambda self: 0})()

        def write(self, data: bytes) -> None:
            written.append(data)

    client = _Client()
    client._status = nats.aio.client.Client.CONNECTED
    client._transport = nats.aio.transport.TcpTransport()
    client._transport._io_writer = Writer()  # type: ignore[assignment]
    client._max_payload = 1 << 20
    assert client.publish_now("$KV.b.k", "_INBOX.r.1", b"payload", headers)
    queued: list[bytes] = []

    async def send_command(cmd: bytes, priority: bool = False) -> None:
        queued.append(cmd)

    client._send_command = send_command  # type: ignore[method-assign]
    client._flush_queue = None
    await client._send_publish("$KV.b.k", "_INBOX.r.1", b"payload", 7, headers)
    assert written == queued and len(written) == 1


async def test_compare_and_sets_share_one_timer_for_their_timeouts(
    nats_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A timer per write cost each claim and release a handle on the loop's heap: a
    run of writes answered in time arms one timer, at the first one's deadline."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        bucket = await kv.bucket("adapter_one_timer")
        revision = await bucket.put("k", b"0")
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        call_at, call_later = loop.call_at, loop.call_later

        def counted_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            armed.append(when)
            return call_at(when, *args, **kwargs)

        def counted_later(delay: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            armed.append(loop.time() + delay)
            return call_later(delay, *args, **kwargs)

        monkeypatch.setattr(loop, "call_at", counted_at)
        monkeypatch.setattr(loop, "call_later", counted_later)
        for i in range(20):
            revision = await bucket.update("k", b"%d" % i, expected_revision=revision)
        assert len(armed) <= 1
        assert kv._acks is not None and kv._acks._waiting == {}
    finally:
        await kv.close()


async def test_a_shorter_timeout_is_kept_behind_a_longer_one_waiting(nats_url: str) -> None:
    """The shared timer stands at the earliest deadline: a request with a short
    timeout fails in time though one with a long timeout armed the timer first, and
    the long one keeps waiting."""
    kv = await NatsKV.connect(NatsSettings(servers=[nats_url]))
    try:
        acks = kv._acks
        assert acks is not None
        silent = await kv.connection.subscribe("adapter.silent")
        await kv.connection.flush()
        long = asyncio.ensure_future(acks.request("adapter.silent", b"a", {}, 30.0))
        await asyncio.sleep(0.05)
        started = asyncio.get_running_loop().time()
        with pytest.raises(nats.errors.TimeoutError):
            await acks.request("adapter.silent", b"b", {}, 0.2)
        assert asyncio.get_running_loop().time() - started < 5.0
        assert not long.done()
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        assert acks._waiting == {}
        await silent.unsubscribe()
    finally:
        await kv.close()


@pytest.mark.parametrize("revision", [0, 1, 41, 18446744073709551615])
def test_the_compare_and_set_header_block_is_the_one_its_headers_make(revision: int) -> None:
    assert nats_store._CAS_HEADER % revision == nats_store._header_block(
        {"Nats-Expected-Last-Subject-Sequence": str(revision)})
