"""The call log: per-call attribution in shared state, for the dashboard.

The agent runtime knows where each call *really* ran (provider, model, victims, wait),
but that lives in the agent's process. To show it in a dashboard that may run
elsewhere, each finished call is written to a fourth bucket, ``kubemoot_call_log``,
one key per call: ``<agent>.<call-id>``. Every key is written once by one process, so
writes need no compare-and-set, and the bucket's max age keeps it to recent history.
The dashboard watches the bucket like the other three.

The writer is wired in by whoever owns an ``AgentRuntime`` (``kubemoot demo``,
``kubemoot agent`` and the gateway do);
it takes plain attribution fields so this module does not depend on the agent package.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field

from kubemoot.store.documents import DOCUMENT_VERSION, wire_name
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import KV, Bucket, StoreError

__all__ = [
    "CALL_LOG_BUCKET",
    "CALL_LOG_MAX_AGE_SECONDS",
    "CallEntry",
    "CallLogWriter",
    "CallRecordLike",
]

log = logging.getLogger(__name__)

CALL_LOG_BUCKET = "kubemoot_call_log"
CALL_LOG_MAX_AGE_SECONDS = 3600.0  # an hour of history is plenty for a live page


class CallEntry(BaseModel):
    """``kubemoot_call_log/<agent>.<call-id>``: where one finished call ran."""

    model_config = ConfigDict(alias_generator=wire_name, populate_by_name=True, extra="ignore")

    version: int = DOCUMENT_VERSION
    agent: str
    thread_id: str
    phase: str
    model: str | None = None
    provider: str | None = None
    action: str
    waited_seconds: float = 0.0  # arrival → start of inference, a load included
    placement_seconds: float = 0.0  # the part until the call held its ticket
    evicted: list[str] = Field(default_factory=list)
    started_at: float
    seconds: float = 0.0
    ok: bool = True
    failure_type: str | None = None
    # the placement's bounded decision summary (options with seconds, failed gates,
    # action, victims): why the call ran where it did
    decision: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> CallEntry:
        return cls.model_validate_json(data)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")


class CallRecordLike(Protocol):
    """The fields of ``kubemoot.runtime.calls.CallRecord`` the log keeps."""

    @property
    def agent(self) -> str: ...
    @property
    def thread_id(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def provider(self) -> str | None: ...
    @property
    def action(self) -> str: ...
    @property
    def waited_seconds(self) -> float: ...
    @property
    def placement_seconds(self) -> float: ...
    @property
    def evicted(self) -> tuple[str, ...]: ...
    @property
    def started_at(self) -> float: ...
    @property
    def seconds(self) -> float: ...
    @property
    def ok(self) -> bool: ...
    @property
    def failure_type(self) -> str | None: ...
    @property
    def decision(self) -> Mapping[str, Any] | None: ...


class CallLogWriter:
    """Writes finished calls to the call-log bucket without blocking the caller.

    :meth:`record` is synchronous (it fits ``AgentRuntime.on_record``): it queues the
    entry and a background task writes it. Losing an entry only thins the page, so a
    store error is logged, never raised into the agent's call.
    """

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket
        # Random per writer so two processes logging for the same agent never collide.
        self._prefix = secrets.token_hex(4)
        self._serial = itertools.count(1)
        # A plain deque, not an asyncio.Queue: nothing ever waits on it (the writer task
        # is started when an entry finds none running), and a Queue's put and get cost
        # about a dozen Python calls per call on the gateway's path.
        self._queue: deque[dict[str, Any]] = deque()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, kv: KV) -> CallLogWriter:
        bucket = await kv.bucket(CALL_LOG_BUCKET, max_age=CALL_LOG_MAX_AGE_SECONDS)
        return cls(bucket)

    def key_for(self, entry: CallEntry) -> str:
        return self._key(entry.agent)

    def _key(self, agent: str) -> str:
        return f"{encode_token(agent)}.{self._prefix}-{next(self._serial):06d}"

    async def publish(self, entry: CallEntry) -> None:
        """Write one entry now."""
        await self._bucket.put(self.key_for(entry), entry.to_json())

    def record(self, call: CallRecordLike) -> None:
        """Queue one finished call (a listener for ``AgentRuntime.on_record``)."""
        # Read once: a runtime record builds its decision summary on each read.
        decision = call.decision
        # The entry as its document, in CallEntry's wire names and field order: the
        # gateway writes one per call, and building the pydantic model to validate
        # fields the runtime typed, then serialising it, cost more than the summary
        # itself (docs/performance.md). _encode writes what CallEntry.to_json would.
        document: dict[str, Any] = {
            "version": DOCUMENT_VERSION, "agent": call.agent, "threadId": call.thread_id,
            "phase": call.phase, "model": call.model, "provider": call.provider,
            "action": call.action, "waitedSeconds": call.waited_seconds,
            "placementSeconds": call.placement_seconds, "evicted": list(call.evicted),
            "startedAt": call.started_at, "seconds": call.seconds, "ok": call.ok,
            "failureType": call.failure_type,
            "decision": dict(decision) if decision is not None else None,
        }
        self._queue.append(document)
        if self._task is None or self._task.done():
            loop = self._task.get_loop() if self._task is not None else None
            if loop is None or loop.is_closed():  # the last writer task's loop, if open
                loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._drain())

    async def _drain(self) -> None:
        queue = self._queue
        while queue:
            document = queue.popleft()
            agent = str(document["agent"])
            try:
                await self._bucket.put(self._key(agent), _encode(document))
            except StoreError as error:
                log.warning("call log write for %s failed: %s", agent, error)
            except ValueError as error:  # a field CallEntry refuses: that entry only
                log.warning("call log entry for %s is not valid: %s", agent, error)

    async def flush(self) -> None:
        """Wait until every queued entry is written (before the store closes)."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        await self._drain()


def _encode(document: dict[str, Any]) -> bytes:
    """A queued entry's document as CallEntry.to_json writes it: orjson when every field
    has the type CallEntry declares (the runtime's records do), so that validating would
    change nothing; anything else goes through CallEntry itself, validated (a refusal
    raises) and written by pydantic, as before."""
    if _as_declared(document):
        try:
            return orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:
            pass  # a value in the decision orjson does not know: pydantic's rules decide
    return CallEntry.model_validate(document).to_json()


def _as_declared(d: dict[str, Any]) -> bool:
    """Does each field already have CallEntry's type (exactly: pydantic would write a
    subclass, or an int where a float is declared, otherwise)? Spelt out, not looped:
    this runs once per call."""
    return (type(d["waitedSeconds"]) is float and type(d["placementSeconds"]) is float
            and type(d["startedAt"]) is float and type(d["seconds"]) is float
            and type(d["agent"]) is str and type(d["threadId"]) is str
            and type(d["phase"]) is str and type(d["action"]) is str
            and (d["model"] is None or type(d["model"]) is str)
            and (d["provider"] is None or type(d["provider"]) is str)
            and (d["failureType"] is None or type(d["failureType"]) is str)
            and type(d["ok"]) is bool
            and (not d["evicted"] or all(type(v) is str for v in d["evicted"]))
            and (d["decision"] is None or type(d["decision"]) is dict))
