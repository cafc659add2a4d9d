"""The distributed store: NATS JetStream KV.

This is the only module that imports ``nats``. Every NATS exception is mapped here to
the errors of :mod:`kubemoot.store.protocol`, so nothing above the store sees one.

Facts about nats-py 2.16 / nats-server 2.15 that shape this adapter (the suite's NATS
tests also pass on nats-py 2.14, the oldest the project allows: 2.13 and older lack
``create(msg_ttl=)`` or fail to parse a cluster's JetStream info; before 2.15 nats-py
parses headers its own way, so :class:`_Client`'s parser is not used there):

* A failed compare-and-set and a create on an existing key raise the same
  ``KeyWrongLastSequenceError``; the operation tells which of ours it is.
* nats-py's ``watch`` replays current values before live ones. We subscribe with an
  ordered consumer that delivers only *new* messages instead, and drop anything at or
  below the stream's last sequence when the watch began (an ordered consumer that
  resets after a reconnect may otherwise replay from the start).
* Per-key TTL exists only on create (``msg_ttl``, whole seconds); we round up.
* An expired key can read back as an entry whose value is ``None``: that is absent.
* nats-py opens a bucket for direct gets when its stream allows them, and keeps that
  choice: once the stream stops allowing them, such a get finds no responders.
* nats-py parses the header block of every message it receives, and every write to a
  watched bucket comes back with the compare-and-set header it was sent with. Its
  parser looks at each character of each header name on its own (a generator step and
  a method call per character: about 80 Python calls per delivery of a ticket write),
  so the connection is a :class:`_Client` that parses the same block with one regular
  expression per line instead (the same dictionary for every input:
  ``tests/store/test_nats_adapter.py``).
* nats-py hands a subscription's messages to its callback through a queue and a task
  of the subscription's own: a wake-up of that task per message, after the read loop
  parsed it. A watch's callback only turns the message into a change for the watch's
  own queue, so a watch takes its messages as the read loop hands them over
  (:class:`_Inline`); its readers still wake on a loop turn of their own.
* nats-py's request waits for its reply with ``asyncio.wait_for`` on a future that the
  task of its shared reply subscription completes: two loop turns and a few dozen calls
  after the reply is read. A compare-and-set (a claim, a release) waits for its
  acknowledgement on an inbox of the store's own instead (:class:`_Acks`), whose replies
  complete their futures as the read loop hands them over.
* nats-py's ``publish`` queues a command for its flusher task, which writes it on the
  next loop turn (a wake-up and some forty calls per write). A compare-and-set writes
  its command to the socket itself when nothing is queued (:meth:`_Client.publish_now`),
  in the same bytes; with commands queued, or no connection up, it publishes through
  nats-py behind them.
* A writer that only passes the outcome on may have it handed over instead of awaiting
  it (:meth:`NatsBucket.update_then`): the ticket lane settles a claim or release as the
  read loop reads its acknowledgement, without a task of its own woken for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import nats
import nats.aio.client
import nats.aio.msg
import nats.aio.transport
import nats.errors
import nats.js.api
import nats.js.errors
import orjson

from kubemoot import metrics
from kubemoot.settings import NatsSettings
from kubemoot.store._watch import QueueWatch
from kubemoot.store.masking import mask_servers
from kubemoot.store.protocol import (
    Change,
    Entry,
    KeyExists,
    RevisionMismatch,
    StoreError,
    StoreUnavailable,
)

__all__ = ["NatsBucket", "NatsKV", "NatsSettings"]

log = logging.getLogger(__name__)

_KV_OPERATION = "KV-Operation"
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"  # what a compare-and-set sends
# its header block, as nats-py would make it of ``{_EXPECTED_LAST: str(revision)}``
_CAS_HEADER = b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: %d\r\n\r\n"
_VALID_KEY = re.compile(r"^[-/_=\.a-zA-Z0-9]+$").match  # nats-py's rule for KV keys
_MARKER_REASON = "Nats-Marker-Reason"
_WRONG_LAST_SEQUENCE = (10071, 10164)  # JetStream's "wrong last sequence" error codes
# A lost connection is built again at most this often, whatever reconnect_wait says.
_MIN_REBUILD_WAIT = 0.2


_UNAVAILABLE = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.NoServersError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    TimeoutError,
    OSError,
)


def _translated(what: str, error: Exception) -> StoreError | None:
    """Our error for a NATS failure of ``what``; None: raise ``error`` itself (one of
    ours already, or no NATS failure)."""
    if isinstance(error, StoreError):
        return None
    if isinstance(error, _UNAVAILABLE):
        return StoreUnavailable(f"{what}: {type(error).__name__}: {error}")
    if isinstance(error, nats.errors.Error):
        return StoreError(f"{what}: {type(error).__name__}: {error}")
    return None


@contextlib.contextmanager
def _edge(what: str) -> Iterator[None]:
    """Map connection-level NATS failures to ours; callers map CAS errors first."""
    try:
        yield
    except Exception as error:
        mapped = _translated(what, error)
        if mapped is None:
            raise
        raise mapped from error


_CRLF = b"\r\n"
_SPACE = re.compile(r"\s").search  # matches exactly the characters str.isspace() accepts


# the header block of a compare-and-set's write, as a watch receives it
_CAS_BLOCK = re.compile(rb"Nats-Expected-Last-Subject-Sequence: ([0-9]+)\r\n\r\n").fullmatch


def _parse_header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's ``Client._parse_header_lines``, with one look per name for whitespace.

    Same rules: ``Name: Value`` per line, lines without a colon skipped, names that are
    not ASCII or hold whitespace skipped, values stripped and decoded as UTF-8 with
    replacement characters. A later line with the same name wins.

    The block nearly every delivery of a watched bucket carries, the one header a
    compare-and-set sends, is read with one match instead of a dozen calls.
    """
    only = _CAS_BLOCK(raw)
    if only is not None:
        return {_EXPECTED_LAST: only[1].decode("ascii")}
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if _SPACE(key) is not None:
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


def _header_block(headers: dict[str, str]) -> bytes:
    """The header block nats-py's ``_send_publish`` sends for ``headers`` whose names
    and values need no cleaning (the store's own: a name of token characters, a value
    without line breaks or surrounding whitespace)."""
    return b"NATS/1.0\r\n" + "".join(
        [f"{name}: {value}\r\n" for name, value in headers.items()]
    ).encode() + b"\r\n"


class _Client(nats.aio.client.Client):
    """nats-py's client with a cheaper header parser and a direct publish (see the
    module's notes)."""

    _parse_header_lines = staticmethod(_parse_header_lines)

    def publish_now(self, subject: str, reply: str, payload: bytes,
                    headers: dict[str, str], block: bytes | None = None) -> bool:
        """Write an ``HPUB`` to the socket in this turn; False: not written (publish
        through nats-py then), when the connection is not up or commands are already
        waiting for the flusher, which must send them first.

        nats-py's ``publish`` queues each command for its flusher task, which wakes on
        the next loop turn to write it. With nothing queued the order on the wire is
        the same either way; nats-py writes its pings the same way. The socket's own
        buffer is left to asyncio, as the flusher's ``writelines`` leaves it; when it
        holds bytes already (the server reads slowly), the flusher's ``drain`` waits.
        ``block``, when given, is ``headers``' header block made already.
        """
        # nats-py's private fields, read with getattr: a nats-py that renamed one
        # publishes through its own path instead of failing every compare-and-set
        transport = getattr(self, "_transport", None)
        if (
            self._status != nats.aio.client.Client.CONNECTED
            or getattr(self, "_pending_data_size", True)
            or type(transport) is not nats.aio.transport.TcpTransport
            or len(payload) > self._max_payload
        ):
            return False
        writer = getattr(transport, "_io_writer", None)
        if writer is None or writer.transport.get_write_buffer_size():
            return False
        header = block if block is not None else _header_block(headers)
        size = len(header)
        writer.write(b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
            subject.encode(), reply.encode(), size, size + len(payload), header, payload))
        stats = self.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(payload)
        return True


async def _connect(options: dict[str, Any]) -> Any:
    """``nats.connect(**options)``, with a :class:`_Client`."""
    connection = _Client()
    await connection.connect(**options)
    return connection


_V1_ACK_TOKENS = 9  # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.…


def _stream_sequence(msg: Any) -> int:
    """The stream sequence of a JetStream delivery: a token of its reply subject.

    nats-py's ``msg.metadata`` makes the same number by building the whole metadata
    (two dataclasses and a timestamp) for each message; the common, domain-less form
    is read here directly, and any other goes through nats-py.
    """
    reply = msg.reply
    if reply:
        tokens = reply.split(".")
        if len(tokens) == _V1_ACK_TOKENS and tokens[0] == "$JS" and tokens[1] == "ACK":
            return int(tokens[5])
    return int(msg.metadata.sequence.stream)


class _Inline:
    """Stands in for a nats-py subscription's pending queue: each message goes to
    ``take`` as the read loop hands it over, instead of waiting in a queue for the
    subscription's task to wake.

    nats-py puts a message here only after its own handling (flow control, an ordered
    consumer's sequence check and reset, heartbeats), and counts it delivered before;
    that every message is taken at once is what it then reads off the queue (empty).
    ``take`` must not wait; what it raises is counted and logged here, since raising
    into the read loop would stop the connection's reading.
    """

    __slots__ = ("_operation", "_sub", "_take", "_what")

    def __init__(self, sub: Any, take: Callable[[Any], None], what: str,
                 operation: str) -> None:
        self._sub = sub
        self._take = take
        self._what = what  # whose messages these are, for the log line
        self._operation = operation  # and the count's label

    def put_nowait(self, msg: Any) -> None:
        self._sub._pending_size -= len(msg.data)  # nats-py added it just before
        try:
            self._take(msg)
        except Exception as error:
            metrics.survived("store", self._operation, metrics.BUG,
                             f"a delivery to {self._what} failed", error,
                             logger=log, exc_info=True)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        return None

    async def join(self) -> None:
        return None


def _take_inline(subscription: Any, take: Callable[[Any], None], what: str,
                 operation: str) -> None:
    """Have a subscription made with a callback hand its messages to ``take`` as they
    are read (:class:`_Inline`) rather than through its task, which is stopped here.

    A message already queued for the task is taken first, in order: nothing is lost
    or reordered between subscribing and this call. ``subscription`` is nats-py's
    plain one or a JetStream one (which wraps a plain one).
    """
    sub = getattr(subscription, "_sub", subscription)
    queued = sub._pending_queue
    inline = _Inline(sub, take, what, operation)
    sub._pending_queue = inline
    subscription._pending_queue = inline  # its copy, read for flow control
    task = sub._wait_for_msgs_task
    if task is not None:
        task.cancel()  # waiting on the queue it no longer gets messages from
    while not queued.empty():
        inline.put_nowait(queued.get_nowait())


_NO_RESPONDERS = "503"  # the status of the reply NATS sends when no stream listens


class _Acks:
    """Requests whose replies come to an inbox of this store's own, one connection's.

    What nats-py's ``request`` does for a publish that waits for its acknowledgement,
    and with the same errors (``TimeoutError``, ``NoRespondersError``), but each reply
    completes its future as the read loop hands it over (:class:`_Inline`), and the
    timeouts share one timer: a timer of its own per request (a handle pushed onto the
    loop's heap and cancelled again) cost a claim or release about fifteen calls, and
    nearly every request is answered long before it. The timer stands at the earliest
    deadline of those waiting; when it fires it fails the requests past theirs and
    stands again at the next one.
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self._prefix = connection.new_inbox() + "."
        self._skip = len(self._prefix)
        #: per reply token: the request's future (None for one sent by :meth:`send`),
        #: its deadline on the loop's clock, and the function :meth:`send` was given
        self._waiting: dict[str, tuple[asyncio.Future[Any] | None, float,
                                       Callable[[Any], None] | None]] = {}
        self._sent = 0
        self._timer: asyncio.TimerHandle | None = None

    async def open(self) -> None:
        async def deliver(msg: Any) -> None:  # nats-py wants a coroutine
            self._take(msg)

        subscription = await self.connection.subscribe(self._prefix + "*", cb=deliver)
        _take_inline(subscription, self._take, "the store's acknowledgements",
                     "acknowledge")

    def _take(self, msg: Any) -> None:
        waiting = self._waiting.pop(msg.subject[self._skip:], None)
        if waiting is None:
            return
        future, _deadline, then = waiting
        if then is not None:  # sent by send()
            then(msg)
        elif future is not None and not future.done():
            future.set_result(msg)

    def _expire(self) -> None:
        """The timer fired: fail the requests past their deadline, and stand the timer
        at the earliest deadline left."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        nearest = math.inf
        lapsed: list[str] = []  # sent by send(): told after the walk, which they may extend
        for token, (future, deadline, _then) in self._waiting.items():
            if future is not None and future.done():
                continue  # timed out before, or answered: its request takes it out
            if deadline > now:
                nearest = min(nearest, deadline)
            elif future is not None:
                future.set_exception(nats.errors.TimeoutError())
            else:
                lapsed.append(token)
        if nearest != math.inf:
            self._timer = loop.call_at(nearest, self._expire)
        for token in lapsed:
            then = self._waiting.pop(token)[2]
            assert then is not None
            then(nats.errors.TimeoutError())

    def _arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Have the timer fire by ``deadline``."""
        timer = self._timer
        if timer is None or deadline < timer.when():  # else it fires first: in time
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._expire)

    def send(self, subject: str, payload: bytes, headers: dict[str, str], timeout: float,
             block: bytes | None, then: Callable[[Any], None]) -> bool:
        """Publish a request in this turn and give ``then`` its reply as the read loop
        hands it over (or nats-py's ``TimeoutError`` once ``timeout`` passed); False,
        with nothing sent, when it cannot be written at once
        (:meth:`_Client.publish_now`). ``then`` is called from the read loop or the
        timer and must not raise."""
        connection = self.connection
        if not isinstance(connection, _Client):
            return False
        self._sent += 1
        token = str(self._sent)
        if not connection.publish_now(subject, self._prefix + token, payload, headers, block):
            return False
        # Registered after the write: its reply cannot be read before this turn ends.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._waiting[token] = (None, deadline, then)
        self._arm(loop, deadline)
        return True

    async def request(self, subject: str, payload: bytes, headers: dict[str, str],
                      timeout: float, block: bytes | None = None) -> Any:
        self._sent += 1
        token = str(self._sent)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        deadline = loop.time() + timeout
        self._waiting[token] = (future, deadline, None)
        self._arm(loop, deadline)
        try:
            connection = self.connection
            reply = self._prefix + token
            if not (isinstance(connection, _Client)
                    and connection.publish_now(subject, reply, payload, headers, block)):
                await connection.publish(subject, payload, reply=reply, headers=headers)
            msg = await future
        finally:
            self._waiting.pop(token, None)
        if msg.headers and msg.headers.get(nats.js.api.Header.STATUS) == _NO_RESPONDERS:
            raise nats.errors.NoRespondersError
        return msg


def _acked_sequence(msg: Any) -> int:
    """The stream sequence a JetStream publish's acknowledgement names, or the error it
    carries raised as nats-py's JetStream publish raises it (``NoStreamResponseError``
    for no responders, ``KeyWrongLastSequenceError`` for a lost compare-and-set, the
    API error's own type for the rest).

    Left out is what no caller here reads: the ack is decoded by orjson and only its
    sequence is taken, where nats-py decodes it with the standard library and copies
    every field into a dataclass.
    """
    if msg.headers and msg.headers.get(nats.js.api.Header.STATUS) == _NO_RESPONDERS:
        raise nats.js.errors.NoStreamResponseError
    ack = orjson.loads(msg.data)
    problem = ack.get("error")
    if problem is not None:
        if problem.get("err_code") in _WRONG_LAST_SEQUENCE:
            raise nats.js.errors.KeyWrongLastSequenceError(
                description=problem.get("description")
            )
        nats.js.errors.APIError.from_error(problem)  # raises the error's own type
    return int(ack["seq"])


class NatsBucket:
    """One JetStream KV bucket."""

    def __init__(self, name: str, kv: Any, js: Any, owner: NatsKV) -> None:
        self.name = name
        self._kv = kv
        self._js = js
        self._owner = owner
        self._stream = f"KV_{name}"
        self._prefix = f"$KV.{name}."

    async def _rebind(self, js: Any) -> None:
        """Move onto a new connection's JetStream context (the old one is closed)."""
        with _edge(f"open bucket {self.name}"):
            self._kv = await js.key_value(self.name)
        self._js = js

    async def get(self, key: str) -> Entry | None:
        with _edge(f"get {self.name}/{key}"):
            try:
                try:
                    found = await self._kv.get(key)
                except nats.errors.NoRespondersError:
                    # Opened for direct gets, but a client that wants more replicas has
                    # since replicated the bucket and turned them off: nobody answers
                    # them any more. Open it again (now read through the leader).
                    self._kv = await self._js.key_value(self.name)
                    found = await self._kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return None
        if found.value is None:  # a limit marker left by expiry
            return None
        return Entry(key=key, value=bytes(found.value), revision=int(found.revision))

    async def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        # The gets go out together: one round trip's wait for all of them.
        return list(await asyncio.gather(*(self.get(key) for key in keys)))

    async def create(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        msg_ttl = None if ttl is None else max(1, math.ceil(ttl))
        with _edge(f"create {self.name}/{key}"):
            try:
                return int(await self._kv.create(key, value, msg_ttl=msg_ttl))
            except nats.js.errors.KeyWrongLastSequenceError as error:
                raise KeyExists(f"bucket {self.name!r}: key {key!r} already exists") from error

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> int:
        # What ``with _edge(...)`` does, without a generator and a message per write:
        # a claim and its release each come here once.
        try:
            return await self._publish(key, value, {_EXPECTED_LAST: str(expected_revision)},
                                       _CAS_HEADER % expected_revision)
        except Exception as error:
            mapped = self._update_error(key, expected_revision, error)
            if mapped is None:
                raise
            raise mapped from error

    def _update_error(self, key: str, expected_revision: int,
                      error: Exception) -> StoreError | None:
        """Our error for a compare-and-set's NATS failure; None: ``error`` is no NATS
        failure (or one of ours already)."""
        if isinstance(error, nats.js.errors.KeyWrongLastSequenceError):
            return RevisionMismatch(
                f"bucket {self.name!r}: key {key!r} is not at revision {expected_revision}"
            )
        return _translated(f"update {self.name}/{key}", error)

    def update_then(self, key: str, value: bytes, expected_revision: int,
                    then: Callable[[int | Exception], None]) -> bool:
        """:meth:`update` whose outcome is handed to ``then`` as the read loop reads the
        acknowledgement (see :class:`~kubemoot.store.protocol.HandingBucket`).

        The ticket lane writes a claim or a release this way: awaiting :meth:`update`
        in a task of its own cost every call a task started, a loop turn for it to
        write and another for it to wake to the acknowledgement, before its caller woke
        a turn after that. Same bytes, same errors; False when there is no inbox on the
        connection in hand, the key is one :meth:`update` refuses, or the command
        cannot be written in this turn (:meth:`_Client.publish_now`).
        """
        owner = self._owner
        acks = owner._acks
        if (acks is None or acks.connection is not owner._nc or not key or key[0] == "."
                or key[-1] == "." or not _VALID_KEY(key)):
            return False

        def heard(msg: Any) -> None:
            outcome: int | Exception
            try:
                if isinstance(msg, Exception):  # the timer's
                    raise msg
                outcome = _acked_sequence(msg)
            except Exception as error:
                mapped = self._update_error(key, expected_revision, error)
                outcome = error if mapped is None else mapped
            try:
                then(outcome)
            except Exception as error:  # raised into the read loop, it would stop reading
                metrics.survived("store", "update", metrics.BUG,
                                 f"handing an update of {self.name}/{key} on failed",
                                 error, logger=log, exc_info=True)

        return acks.send(self._prefix + key, value, {_EXPECTED_LAST: str(expected_revision)},
                         owner._settings.request_timeout, _CAS_HEADER % expected_revision,
                         heard)

    async def _publish(self, key: str, value: bytes, headers: dict[str, str],
                       block: bytes | None = None) -> int:
        """Publish ``value`` to ``key``'s subject and return the revision its ack names.

        What nats-py's ``KeyValue.update`` does, with the same errors: it raises
        ``KeyWrongLastSequenceError`` for a lost compare-and-set and nats-py's typed
        API errors for the rest (:func:`_acked_sequence`). A claim and its release each
        write once, so this is on every call's path.
        """
        if not key or key[0] == "." or key[-1] == "." or not _VALID_KEY(key):
            raise nats.js.errors.InvalidKeyError(key)
        owner = self._owner
        acks = owner._acks
        try:
            if acks is not None and acks.connection is owner._nc:
                msg = await acks.request(self._prefix + key, value, headers,
                                         owner._settings.request_timeout, block)
            else:  # between connections: whatever the connection in hand says
                msg = await owner._nc.request(
                    self._prefix + key, value, timeout=owner._settings.request_timeout,
                    headers=headers,
                )
        except nats.errors.NoRespondersError as error:  # as nats-py's JetStream publish
            raise nats.js.errors.NoStreamResponseError from error
        return _acked_sequence(msg)

    async def put(self, key: str, value: bytes) -> int:
        with _edge(f"put {self.name}/{key}"):
            return int(await self._kv.put(key, value))

    async def delete(self, key: str, *, expected_revision: int | None = None) -> None:
        with _edge(f"delete {self.name}/{key}"):
            try:
                await self._kv.delete(key, last=expected_revision)
            except nats.js.errors.APIError as error:
                # nats-py maps this code to KeyWrongLastSequenceError for updates only
                if error.err_code not in _WRONG_LAST_SEQUENCE:
                    raise
                raise RevisionMismatch(
                    f"bucket {self.name!r}: key {key!r} is not at revision {expected_revision}"
                ) from error

    async def keys(self) -> list[str]:
        with _edge(f"keys {self.name}"):
            try:
                return sorted(await self._kv.keys())
            except nats.js.errors.NoKeysError:
                return []

    def watch(self) -> QueueWatch:
        subscription: Any = None

        async def start(watch: QueueWatch) -> None:
            nonlocal subscription
            with _edge(f"watch {self.name}"):
                info = await self._js.stream_info(self._stream)
                seen = int(info.state.last_seq)
                name, skip = self.name, len(self._prefix)

                def take(msg: Any) -> None:
                    # every write to the bucket, this process's own included, comes here
                    nonlocal seen
                    revision = _stream_sequence(msg)
                    if revision <= seen:  # a replay after an ordered-consumer reset
                        return
                    seen = revision
                    headers = msg.headers
                    removed = headers is not None and (
                        _KV_OPERATION in headers or _MARKER_REASON in headers
                    )
                    watch.push(Change(name, msg.subject[skip:],
                                      None if removed else bytes(msg.data), revision))

                async def deliver(msg: Any) -> None:  # nats-py wants a coroutine
                    take(msg)

                subscription = await self._js.subscribe(
                    f"{self._prefix}>",
                    stream=self._stream,
                    cb=deliver,
                    ordered_consumer=True,
                    # From the revision after the one read above, not "new": a write
                    # another process made between that read and the consumer's making
                    # was never delivered (a key keeps one revision, so a watch that
                    # starts late still sees only the last of those it missed).
                    deliver_policy=nats.js.api.DeliverPolicy.BY_START_SEQUENCE,
                    config=nats.js.api.ConsumerConfig(opt_start_seq=seen + 1),
                    # short heartbeats: a watch resumes soon after the server returns
                    idle_heartbeat=1.0,
                )
                _take_inline(subscription, take, f"the watch of {name}", "watch")

        async def stop(watch: QueueWatch) -> None:
            self._owner._watches.discard(watch)
            if subscription is not None:
                try:
                    await subscription.unsubscribe()
                except Exception as error:  # the watch ends either way
                    metrics.survived("store", "unwatch", metrics.CLEANUP,
                                     f"unsubscribing the watch of {self.name} failed",
                                     error, logger=log)

        # A reader may have each change handed to it in the read loop's turn: on
        # NATS a change's moment is the network's anyway (the embedded store keeps
        # its readers' turns, which the simulator's decisions follow).
        watch = QueueWatch(start=start, stop=stop, handing=True)
        self._owner._watches.add(watch)
        return watch


class NatsKV:
    """A :class:`~kubemoot.store.protocol.KV` over one NATS connection.

    nats-py reconnects by itself for ``max_reconnect_attempts`` rounds and then closes
    the connection for good: every operation after that fails, however soon the server
    is back. A long-running process must not end up like that, so when the connection
    closes without :meth:`close` being called, this store builds a new one — every
    ``reconnect_wait`` seconds for as long as the process runs — and moves its buckets
    and watches onto it. Meanwhile operations raise :class:`StoreUnavailable`. Both the
    loss and the return are said once at WARNING.
    """

    def __init__(self, connection: Any, settings: NatsSettings,
                 options: dict[str, Any] | None = None) -> None:
        self._nc = connection
        self._js = connection.jetstream(timeout=settings.request_timeout)
        self._settings = settings
        self._options = options  # how to connect again; None: never rebuild
        self._buckets: dict[str, NatsBucket] = {}
        self._watches: set[QueueWatch] = set()
        self._closing = False
        self._rebuilding: asyncio.Task[None] | None = None
        #: how many times the connection was built again after nats-py gave up on it
        self.rebuilds = 0
        # Where compare-and-sets hear their acknowledgements (see _Acks); made with
        # each connection by _open_acks.
        self._acks: _Acks | None = None

    async def _open_acks(self) -> None:
        acks = _Acks(self._nc)
        with _edge("subscribe to acknowledgements"):
            await acks.open()
        self._acks = acks

    def _connection_closed(self) -> None:
        """nats-py closed the connection; unless we asked for it, build a new one."""
        if self._closing or self._options is None:
            return
        if self._rebuilding is not None and not self._rebuilding.done():
            return
        log.warning("NATS at %s: the connection gave up after %s reconnect rounds; a new "
                    "one is tried every %g s for as long as this process runs",
                    mask_servers(self._settings.servers),
                    self._settings.max_reconnect_attempts, self._retry_seconds)
        self._rebuilding = asyncio.get_running_loop().create_task(self._rebuild())

    @property
    def _retry_seconds(self) -> float:
        return max(self._settings.reconnect_wait, _MIN_REBUILD_WAIT)

    async def _rebuild(self) -> None:
        assert self._options is not None
        while not self._closing:
            try:
                connection = await _connect(self._options)
            except (nats.errors.Error, OSError, TimeoutError, StoreError):
                await asyncio.sleep(self._retry_seconds)
                continue
            if self._closing:
                await connection.close()
                return
            self._nc = connection
            self._js = connection.jetstream(timeout=self._settings.request_timeout)
            try:
                await self._open_acks()
                for bucket in list(self._buckets.values()):
                    await bucket._rebind(self._js)
                for watch in list(self._watches):
                    await watch.resume()
            except StoreError as error:
                # the server went away again while we moved over: start from scratch
                log.debug("NATS: moving onto the new connection failed: %s", error)
                with contextlib.suppress(Exception):
                    await connection.close()
                continue
            self.rebuilds += 1
            log.warning("NATS at %s: connected again; the store answers",
                        mask_servers(self._settings.servers))
            return

    @classmethod
    async def connect(cls, settings: NatsSettings | None = None) -> NatsKV:
        """Connect (raises :class:`StoreUnavailable` when no server answers)."""
        settings = settings if settings is not None else NatsSettings()

        connected = False
        made: list[NatsKV] = []  # the store, once built: told when its connection closes

        async def closed() -> None:
            if made:
                made[0]._connection_closed()

        where = mask_servers(settings.servers)  # a message is no place for a password

        async def quiet(error: Exception) -> None:
            # nats-py reports reconnect noise here; operations surface real failures.
            # A refused login while first connecting is final, though: retrying it for
            # every reconnect round would only delay the same answer by a minute.
            # nats-py reports the server's -ERR as a plain Error during the handshake.
            refused = isinstance(error, nats.errors.AuthorizationError) or (
                isinstance(error, nats.errors.Error)
                and "authorization violation" in str(error).lower()
            )
            if not connected and refused:
                raise StoreUnavailable(f"NATS at {where} refused the credentials: {error}")
            return None

        options: dict[str, Any] = {
            "servers": settings.servers,
            "name": settings.name,
            "connect_timeout": settings.connect_timeout,
            "max_reconnect_attempts": settings.max_reconnect_attempts,
            "reconnect_time_wait": settings.reconnect_wait,
            "allow_reconnect": True,
            "error_cb": quiet,
            "closed_cb": closed,
        }
        if settings.user is not None:
            options["user"] = settings.user
            options["password"] = settings.password
        if settings.token is not None:
            options["token"] = settings.token
        if settings.credentials_file is not None:
            options["user_credentials"] = settings.credentials_file
        tls = settings.tls_context()
        if tls is not None:
            options["tls"] = tls
        try:
            connection = await _connect(options)
        except StoreUnavailable:
            raise
        except (nats.errors.Error, OSError, TimeoutError) as error:
            raise StoreUnavailable(
                f"cannot connect to NATS at {where}: {type(error).__name__}: {error}"
            ) from error
        connected = True
        made.append(cls(connection, settings, options))
        try:
            await made[0]._open_acks()
        except BaseException:
            await made[0].close()
            raise
        return made[0]

    async def bucket(self, name: str, *, max_age: float | None = None) -> NatsBucket:
        """Open a bucket, creating it (history 1, the given max age) when missing."""
        found = self._buckets.get(name)
        if found is not None:
            return found
        with _edge(f"open bucket {name}"):
            try:
                kv = await self._js.key_value(name)
            except nats.js.errors.BucketNotFoundError:
                try:
                    # Direct gets may be answered by any replica, and a lagging one
                    # returns an old revision: a release that reads its ticket as
                    # already gone would leak it. Replicated buckets read via the leader.
                    replicas = self._settings.replicas
                    kv = await self._js.create_key_value(
                        bucket=name, history=1, ttl=max_age, direct=replicas == 1,
                        replicas=replicas,
                    )
                except nats.js.errors.BadRequestError:
                    kv = await self._js.key_value(name)  # another process created it first
            kv = await self._replicate(name, kv)
        bucket = NatsBucket(name, kv, self._js, self)
        self._buckets[name] = bucket
        return bucket

    async def _replicate(self, name: str, kv: Any) -> Any:
        """Raise an existing bucket to this client's replica count, leader reads only.

        Any client may be first to create a bucket, with its own count: an agent without
        ``KUBEMOOT_NATS_REPLICAS`` makes a one-copy bucket that the operator, set to three,
        would otherwise open and leave so. A client never lowers the count.
        """
        wanted = self._settings.replicas
        if wanted == 1:
            return kv
        config = (await self._js.stream_info(f"KV_{name}")).config
        if (config.num_replicas or 1) >= wanted and not config.allow_direct:
            return kv
        log.info("bucket %s: %s replica(s) and direct gets %s; now %s and leader reads",
                 name, config.num_replicas, "on" if config.allow_direct else "off", wanted)
        config.num_replicas = max(wanted, config.num_replicas or 1)
        config.allow_direct = False
        await self._js.update_stream(config)
        return await self._js.key_value(name)

    @property
    def connection(self) -> Any:
        """The NATS connection, for adapters that share it (the crew's bus)."""
        return self._nc

    async def close(self) -> None:
        self._closing = True
        if self._rebuilding is not None:
            self._rebuilding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rebuilding
        for watch in list(self._watches):
            await watch.aclose()
        try:
            await self._nc.close()
        except Exception as error:  # the connection is going away either way
            metrics.survived("store", "close", metrics.CLEANUP,
                             "closing the NATS connection failed", error, logger=log)
