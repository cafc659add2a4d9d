"""A crew whose agents run as separate processes, discussing over a message bus.

The discussion engine is :class:`~kubemoot.agent.discussion.Coordinator`, unchanged:
the coordinator's process runs it, and each selected member's part (planning at
selection, triage, mulling, its signal) runs in that member's own process, on that
process's per-call runtime. What crosses the bus are the same things the in-process
engine passes around: the thread, signals, call records, and the deadline's end.

Subjects, under ``kubemoot.crew.<namespace>.<crew>`` (names encoded as subject tokens):

* ``ask`` — a question (``kubemoot ask``); one coordinator of the queue group answers
  with the discussion's result and every call's attribution.
* ``rollcall`` — the coordinator's roll call; every member process replies with its id,
  role and mulling candidates.
* ``agent.<agent>.select`` — the coordinator selects a member for a thread; the member
  acknowledges, plans its first mulling call at once, then evaluates.
* ``thread.<thread>.from.<agent>`` — a member's signals, call records and heartbeats
  for one thread, in order, ending with ``final``.
* ``thread.<thread>.done`` — the deadline passed: members still waiting for a GPU stand
  aside, as in the in-process engine.

A member process that dies mid-discussion falls silent; after
``crew.silence_seconds`` without a word the coordinator records a ``failure`` for it and
the discussion goes on (its deadline still ends it). The calls the dead process held
tickets for are reclaimed by the tickets' TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from kubemoot.agent.crew import COORDINATOR_ROLE
from kubemoot.agent.discussion import (
    AgentProfile,
    Coordinator,
    DiscussionResult,
    Settlement,
    Thread,
)
from kubemoot.agent.runtime import AgentRuntime, CallRecord
from kubemoot.agent.signals import (
    FailureType,
    Signal,
    SignalMetadata,
    SignalSink,
    SignalType,
)
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import Settings
from kubemoot.store.bus import Bus, BusError, Message, Subscription
from kubemoot.store.keys import encode_token

__all__ = [
    "COORDINATOR_QUEUE",
    "CrewAnswer",
    "CrewCoordinator",
    "CrewMember",
    "CrewRef",
    "RemoteMembers",
    "record_from_wire",
    "record_to_wire",
    "signal_from_wire",
]

log = logging.getLogger(__name__)

SUBJECT_ROOT = "kubemoot.crew"
COORDINATOR_QUEUE = "coordinators"  # several coordinator replicas: one answers
MEMBER_QUEUE = "replicas"  # several replicas of one member: one takes a thread


@dataclass(frozen=True, slots=True)
class CrewRef:
    """A crew: the namespace of its Agents and the ``kubemoot.ai/crew`` label value."""

    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str) -> CrewRef:
        """``NAMESPACE/CREW``; ``ValueError`` says what is wrong."""
        namespace, slash, name = text.strip().partition("/")
        if not slash or not namespace or not name or "/" in name:
            raise ValueError(f"{text!r} is not NAMESPACE/CREW")
        return cls(namespace, name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def subject(self, *parts: str) -> str:
        tokens = [encode_token(self.namespace), encode_token(self.name), *parts]
        return ".".join([SUBJECT_ROOT, *tokens])

    def ask_subject(self) -> str:
        return self.subject("ask")

    def select_subject(self, agent: str) -> str:
        return self.subject("agent", encode_token(agent), "select")

    def thread_subject(self, thread_id: str, agent: str) -> str:
        return self.subject("thread", encode_token(thread_id), "from", encode_token(agent))

    def done_subject(self, thread_id: str) -> str:
        return self.subject("thread", encode_token(thread_id), "done")


# -- the wire ----------------------------------------------------------------------------


def _dump(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def _load(data: bytes) -> dict[str, Any]:
    body = json.loads(data.decode("utf-8"))
    if not isinstance(body, dict):
        raise ValueError("a crew message is a JSON object")
    return body


def signal_to_wire(signal: Signal) -> dict[str, Any]:
    return signal.to_dict()


def signal_from_wire(body: dict[str, Any]) -> Signal:
    """The inverse of :meth:`Signal.to_dict`."""
    meta = body.get("metadata") or {}
    waited = meta.get("waitedSeconds")
    return Signal(
        SignalType(body["type"]), str(body["agent"]), str(body["threadId"]),
        float(body["at"]), phase=body.get("phase"), content=str(body.get("content", "")),
        metadata=SignalMetadata(
            provider=meta.get("provider"), model=meta.get("model"),
            evicted=tuple(meta.get("evicted") or ()), reason=meta.get("reason"),
            failure_type=meta.get("failureType"), failed_tool=meta.get("failedTool"),
            last_error=meta.get("lastError"),
            waited_seconds=None if waited is None else float(waited),
        ),
    )


def record_to_wire(record: CallRecord) -> dict[str, Any]:
    """:meth:`CallRecord.to_dict` (camelCase, as ``kubemoot ask -o json`` prints it) and
    when the call started."""
    return {**record.to_dict(), "startedAt": record.started_at}


def record_from_wire(body: dict[str, Any]) -> CallRecord:
    def text(key: str) -> str | None:
        value = body.get(key)
        return None if value is None else str(value)

    tokens = body.get("promptTokens")
    decision = body.get("decision")
    return CallRecord(
        thread_id=str(body["threadId"]), agent=str(body["agent"]), phase=str(body["phase"]),
        model=text("model"), provider=text("provider"), endpoint=text("endpoint"),
        action=str(body["action"]), waited_seconds=float(body.get("waitedSeconds") or 0.0),
        evicted=tuple(str(m) for m in body.get("evicted") or ()),
        started_at=float(body["startedAt"]), seconds=float(body.get("seconds") or 0.0),
        ok=bool(body.get("ok")), prompt_tokens=None if tokens is None else int(tokens),
        model_calls=int(body.get("modelCalls") or 0), reason=text("reason"),
        failure_type=text("failureType"),
        summary=decision if isinstance(decision, dict) else None,
    )


def _profile_to_wire(profile: AgentProfile) -> dict[str, Any]:
    return {"id": profile.id, "role": profile.role,
            "mulling": [{"model": c.model, "score": c.score} for c in profile.mulling],
            "unschedulable": dict(profile.unschedulable)}


def _profile_from_wire(body: dict[str, Any]) -> AgentProfile:
    return AgentProfile(
        id=str(body["id"]), role=str(body["role"]),
        mulling=tuple(CandidateModel(str(c["model"]), float(c["score"]))
                      for c in body.get("mulling") or ()),
        unschedulable={str(k): str(v) for k, v in (body.get("unschedulable") or {}).items()},
    )


def _failure(agent: str, thread: Thread, at: float, why: str) -> Signal:
    return Signal(SignalType.FAILURE, agent, thread.id, at, phase="mulling",
                  metadata=SignalMetadata(failure_type=FailureType.AGENT_ERROR.value,
                                          last_error=why))


# -- the member's side -------------------------------------------------------------------


class _Outbox:
    """One thread's messages from a member to the coordinator, published in order."""

    def __init__(self, bus: Bus, subject: str) -> None:
        self._bus = bus
        self._subject = subject
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._pump = asyncio.ensure_future(self._run())

    def send(self, kind: str, **body: Any) -> None:
        self._queue.put_nowait(_dump({"kind": kind, **body}))

    def emit(self, signal: Signal) -> None:
        """A :class:`~kubemoot.agent.signals.SignalSink`: signals go out as they come."""
        self.send("signal", signal=signal_to_wire(signal))

    async def _run(self) -> None:
        while (data := await self._queue.get()) is not None:
            try:
                await self._bus.publish(self._subject, data)
            except BusError as error:  # the coordinator then hears silence: a failure
                log.warning("cannot report to the coordinator on %s: %s", self._subject, error)

    async def close(self) -> None:
        """Send what is queued, then stop."""
        self._queue.put_nowait(None)
        await asyncio.shield(self._pump)


class CrewMember:
    """One agent process's part in its crew's discussions.

    It answers the coordinator's roll call and, when selected for a thread, does what
    the in-process engine does for a member: plan the first mulling call at once, then
    triage and mull on this process's runtime, reporting every signal and call record.
    """

    def __init__(self, bus: Bus, crew: CrewRef, profile: AgentProfile, runtime: AgentRuntime,
                 settings: Settings) -> None:
        self.bus = bus
        self.crew = crew
        self.profile = profile
        self.runtime = runtime
        self.settings = settings
        self._engine = Coordinator(runtime, profile)
        self._outboxes: dict[str, _Outbox] = {}
        self._work: dict[str, asyncio.Task[None]] = {}
        self._subs: list[Subscription] = []
        runtime.on_record(self._on_record)

    async def start(self) -> None:
        self._subs.append(await self.bus.subscribe(self.crew.subject("rollcall"),
                                                   self._roll_call))
        # Replicas of one Agent's Deployment: each selection goes to one of them.
        self._subs.append(await self.bus.subscribe(self.crew.select_subject(self.profile.id),
                                                   self._selected, queue=MEMBER_QUEUE))

    async def stop(self) -> None:
        """Leave: no new threads; threads in progress end (their tickets and plans are
        given back) and tell the coordinator this agent stopped."""
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        for task in self._work.values():
            task.cancel()
        await asyncio.gather(*self._work.values(), return_exceptions=True)

    async def _roll_call(self, message: Message) -> None:
        if message.reply:
            await self.bus.publish(message.reply, _dump(_profile_to_wire(self.profile)))

    async def _selected(self, message: Message) -> None:
        try:
            body = _load(message.data)
            thread = Thread(str(body["threadId"]), str(body["question"]))
        except (ValueError, KeyError, TypeError) as error:
            log.warning("ignoring a malformed selection on %s: %s", message.subject, error)
            return
        if thread.id not in self._work:
            # Listen for the deadline before saying yes: the coordinator may announce
            # it any time after the acknowledgement.
            done = asyncio.Event()

            async def deadline(_: Message) -> None:
                done.set()

            done_sub = await self.bus.subscribe(self.crew.done_subject(thread.id), deadline)
            task = asyncio.ensure_future(self._take_part(thread, done, done_sub))
            self._work[thread.id] = task
            task.add_done_callback(lambda _: self._work.pop(thread.id, None))
        if message.reply:
            await self.bus.publish(message.reply, _dump({"accepted": thread.id}))

    async def _take_part(self, thread: Thread, done: asyncio.Event,
                         done_sub: Subscription) -> None:
        agent = self.profile.id
        outbox = _Outbox(self.bus, self.crew.thread_subject(thread.id, agent))
        self._outboxes[thread.id] = outbox
        beat = asyncio.ensure_future(self._heartbeat(outbox))
        held_plans = self.runtime.held_plans
        try:
            try:  # planning at selection: the load overlaps triage
                await held_plans.commit_to_thread(agent, thread.id, self.profile.mulling)
            except Exception as error:  # an optimisation, never fatal
                log.warning("planning at selection failed for %s: %s", agent, error)
            await self._engine.evaluate(self.profile, thread, done, outbox)
        except asyncio.CancelledError:
            outbox.emit(_failure(agent, thread, self.runtime.clock.now(),
                                 "the agent's process stopped during the discussion"))
            raise
        finally:
            beat.cancel()
            outbox.send("final")  # queued first: a second cancellation cannot lose it
            try:
                with contextlib.suppress(Exception):
                    await asyncio.shield(held_plans.close_thread(thread.id))
            finally:
                await outbox.close()
                self._outboxes.pop(thread.id, None)
                await done_sub.unsubscribe()

    async def _heartbeat(self, outbox: _Outbox) -> None:
        while True:
            outbox.send("heartbeat")
            await self.runtime.clock.sleep(self.settings.crew.heartbeat_seconds)

    def _on_record(self, record: CallRecord) -> None:
        outbox = self._outboxes.get(record.thread_id)
        if outbox is not None and record.agent == self.profile.id:
            outbox.send("record", record=record_to_wire(record))


# -- the coordinator's side ----------------------------------------------------------------


class RemoteMembers:
    """The coordinator's view of members working in their own processes.

    :meth:`evaluate` has the shape of the engine's member evaluation, so the engine
    runs unchanged: it selects the member over the bus, relays the member's signals to
    the engine's sink and keeps its call records, and returns when the member reports
    its end, falls silent, or the deadline's grace has passed.
    """

    def __init__(self, bus: Bus, crew: CrewRef, settings: Settings,
                 runtime: AgentRuntime) -> None:
        self.bus = bus
        self.crew = crew
        self.settings = settings
        self.clock = runtime.clock
        self.records: list[CallRecord] = []
        self._announced: set[str] = set()

    async def evaluate(self, member: AgentProfile, thread: Thread, done: asyncio.Event,
                       sink: SignalSink) -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def take(message: Message) -> None:
            with contextlib.suppress(ValueError):
                inbox.put_nowait(_load(message.data))

        silence = self.settings.crew.silence_seconds
        sub = await self.bus.subscribe(self.crew.thread_subject(thread.id, member.id), take)
        try:
            try:
                await self.bus.request(self.crew.select_subject(member.id),
                                       _dump({"threadId": thread.id,
                                              "question": thread.question}),
                                       timeout=silence)
            except BusError as error:
                sink.emit(_failure(member.id, thread, self.clock.now(),
                                   f"the agent's process did not take the thread: {error}"))
                return
            await self._follow(member, thread, done, sink, inbox, silence)
        finally:
            await sub.unsubscribe()

    async def _follow(self, member: AgentProfile, thread: Thread, done: asyncio.Event,
                      sink: SignalSink, inbox: asyncio.Queue[dict[str, Any]],
                      silence: float) -> None:
        ends_at: float | None = None  # after the deadline: the grace's end
        while True:
            if done.is_set() and ends_at is None:
                ends_at = self.clock.now() + silence
                await self._announce_done(thread)
            limit = silence if ends_at is None else max(0.0, ends_at - self.clock.now())
            message = await self._next(inbox, done, limit)
            if message is None:
                if done.is_set() and ends_at is None:
                    continue  # the deadline passed: tell the members, then wait the grace
                why = (f"no word from the agent's process for {silence:g} s (it stopped or "
                       "was restarted)") if ends_at is None else (
                       f"the agent's process had not finished {silence:g} s after the "
                       "discussion's deadline")
                sink.emit(_failure(member.id, thread, self.clock.now(), why))
                return
            kind = message.get("kind")
            try:
                if kind == "signal":
                    sink.emit(signal_from_wire(message["signal"]))
                elif kind == "record":
                    self.records.append(record_from_wire(message["record"]))
                elif kind == "final":
                    return
            except (KeyError, ValueError, TypeError) as error:
                log.warning("malformed %s message from %s: %s", kind, member.id, error)

    async def _next(self, inbox: asyncio.Queue[dict[str, Any]], done: asyncio.Event,
                    limit: float) -> dict[str, Any] | None:
        """The next message, or ``None`` after ``limit`` seconds or when ``done`` is
        newly set (whichever comes first)."""
        if not inbox.empty():
            return inbox.get_nowait()
        getting = asyncio.ensure_future(inbox.get())
        waiters: list[asyncio.Future[Any]] = [getting]
        if not done.is_set():
            waiters.append(asyncio.ensure_future(done.wait()))
        try:
            with contextlib.suppress(TimeoutError):
                await self.clock.wait_for(
                    asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED), limit)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if getting.done() and not getting.cancelled():
            return getting.result()
        return None

    async def _announce_done(self, thread: Thread) -> None:
        if thread.id in self._announced:
            return
        self._announced.add(thread.id)
        try:
            await self.bus.publish(self.crew.done_subject(thread.id), b"{}")
        except BusError as error:  # members then stand aside at their own wait limit
            log.warning("cannot announce the deadline of %s: %s", thread.id, error)


@dataclass(slots=True)
class CrewAnswer:
    """A discussion's result with every call's attribution, as ``kubemoot ask`` gets it."""

    crew: CrewRef
    result: DiscussionResult
    calls: list[CallRecord]
    members: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"crew": str(self.crew), **self.result.to_dict(), "members": self.members,
                "calls": [record_to_wire(c) for c in self.calls]}


class CrewCoordinator:
    """The coordinator Agent's process: answers questions asked of its crew."""

    def __init__(self, bus: Bus, crew: CrewRef, profile: AgentProfile, runtime: AgentRuntime,
                 settings: Settings) -> None:
        self.bus = bus
        self.crew = crew
        self.profile = profile
        self.runtime = runtime
        self.settings = settings
        self._subs: list[Subscription] = []
        self._asks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._subs.append(await self.bus.subscribe(self.crew.ask_subject(), self._asked,
                                                   queue=COORDINATOR_QUEUE))

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
        for task in self._asks:
            task.cancel()
        await asyncio.gather(*self._asks, return_exceptions=True)

    async def _asked(self, message: Message) -> None:
        task = asyncio.ensure_future(self._answer(message))
        self._asks.add(task)
        task.add_done_callback(self._asks.discard)

    async def _answer(self, message: Message) -> None:
        try:
            body = _load(message.data)
            question = body["question"]
            if not isinstance(question, str) or not question.strip():
                raise ValueError("the question is empty")
        except (ValueError, KeyError) as error:
            reply: dict[str, Any] = {"error": f"not a question: {error}"}
        else:
            try:
                reply = (await self.discuss(question.strip())).to_dict()
            except asyncio.CancelledError:
                # the coordinator's process is stopping: the asker hears it now rather
                # than at its own timeout
                if message.reply:
                    with contextlib.suppress(BusError):
                        await self.bus.publish(message.reply, _dump(
                            {"error": "the coordinator stopped before the crew answered; "
                                      "ask again"}))
                raise
            except Exception as error:  # the asker gets a line, not silence
                log.exception("discussion failed")
                reply = {"error": f"the discussion failed: {type(error).__name__}: {error}"}
        if message.reply:
            await self.bus.publish(message.reply, _dump(reply))

    async def roll_call(self) -> list[AgentProfile]:
        """The members that answer now, coordinators left out, one profile per agent."""
        replies = await self.bus.gather(self.crew.subject("rollcall"), b"{}",
                                        window=self.settings.crew.roll_call_seconds)
        members: dict[str, AgentProfile] = {}
        for data in replies:
            try:
                profile = _profile_from_wire(_load(data))
            except (ValueError, KeyError, TypeError) as error:
                log.warning("ignoring a malformed roll-call answer: %s", error)
                continue
            if profile.id != self.profile.id and profile.role != COORDINATOR_ROLE:
                members.setdefault(profile.id, profile)
        return [members[k] for k in sorted(members)]

    async def discuss(self, question: str) -> CrewAnswer:
        thread = Thread(f"{self.crew.name}-{uuid.uuid4().hex[:12]}", question)
        members = await self.roll_call()
        if not members:
            text = (f"No member of crew {self.crew} answered the roll call; check that "
                    "their `kubemoot agent` processes run and reach NATS.")
            return CrewAnswer(self.crew, DiscussionResult(thread, Settlement.NO_CONTRIBUTION,
                                                          text), [], [])
        remote = RemoteMembers(self.bus, self.crew, self.settings, self.runtime)
        engine = Coordinator(self.runtime, self.profile,
                             deadline_seconds=self.settings.runtime.gpu_wait_limit_seconds,
                             evaluate=remote.evaluate)
        result = await engine.discuss(thread, members)
        own = [r for r in self.runtime.records if r.thread_id == thread.id]
        calls = sorted([*own, *remote.records], key=lambda r: r.started_at)
        return CrewAnswer(self.crew, result, calls, [m.id for m in members])

