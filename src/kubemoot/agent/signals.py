"""Consensus signals an agent publishes, with per-call attribution.

A signal is what the coordinator sees of an agent's work in a discussion: a position
(``agree``, ``concern``, ``stand_aside``), a ``failure`` of the agent's own machinery,
or a progress note (``waiting`` for a GPU, ``evaluating`` again once it got one).
Every signal from a scheduled call names the provider the call really ran on, the model
it really ran and the models it evicted, so the crew's answer and the dashboard can say
which card did the work rather than which card the operator bound at reconcile time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CallbackSink",
    "FailureType",
    "ListSink",
    "Signal",
    "SignalMetadata",
    "SignalSink",
    "SignalType",
]


class SignalType(StrEnum):
    """The six consensus signals."""

    AGREE = "agree"
    CONCERN = "concern"
    STAND_ASIDE = "stand_aside"
    FAILURE = "failure"
    WAITING = "waiting"
    EVALUATING = "evaluating"


class FailureType(StrEnum):
    """What tripped when an agent publishes ``failure`` (``metadata.failureType``)."""

    CONTEXT_EXCEEDED = "CONTEXT_EXCEEDED"  # the next prompt would not fit the context
    TOOL_FAILURES = "TOOL_FAILURES"  # a tool failure cap was reached
    MAX_ITERATIONS = "MAX_ITERATIONS"  # the tool loop ran out of iterations
    PROVIDER_ERROR = "PROVIDER_ERROR"  # the engine failed the call (after its one retry)
    PROVIDER_TIMEOUT = "PROVIDER_TIMEOUT"  # the engine did not answer in time
    AGENT_ERROR = "AGENT_ERROR"  # the agent's own machinery failed (store, a bug)


@dataclass(frozen=True, slots=True)
class SignalMetadata:
    """Attribution and cause. Fields that do not apply stay ``None`` (or empty)."""

    provider: str | None = None
    model: str | None = None
    evicted: tuple[str, ...] = ()
    reason: str | None = None
    failure_type: str | None = None
    failed_tool: str | None = None
    last_error: str | None = None
    waited_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """camelCase, without the fields that do not apply."""
        raw: dict[str, Any] = {
            "provider": self.provider,
            "model": self.model,
            "evicted": list(self.evicted),
            "reason": self.reason,
            "failureType": self.failure_type,
            "failedTool": self.failed_tool,
            "lastError": self.last_error,
            "waitedSeconds": self.waited_seconds,
        }
        return {k: v for k, v in raw.items() if v is not None and v != []}


@dataclass(frozen=True, slots=True)
class Signal:
    """One signal from one agent in one thread."""

    type: SignalType
    agent: str
    thread_id: str
    at: float
    phase: str | None = None
    content: str = ""
    metadata: SignalMetadata = field(default_factory=SignalMetadata)

    @property
    def is_position(self) -> bool:
        """``agree`` or ``concern``: the agent contributed to the answer."""
        return self.type in (SignalType.AGREE, SignalType.CONCERN)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type.value,
            "agent": self.agent,
            "threadId": self.thread_id,
            "at": self.at,
            "metadata": self.metadata.to_dict(),
        }
        if self.phase is not None:
            out["phase"] = self.phase
        if self.content:
            out["content"] = self.content
        return out


@runtime_checkable
class SignalSink(Protocol):
    """Where signals go: the coordinator's record, a live view, a message bus."""

    def emit(self, signal: Signal) -> None:
        """Take one signal; must not block (record it, hand it on)."""
        ...


class ListSink:
    """A sink that keeps every signal in order (tests, the coordinator's record)."""

    def __init__(self) -> None:
        self.signals: list[Signal] = []

    def emit(self, signal: Signal) -> None:
        self.signals.append(signal)


class CallbackSink:
    """A sink that fans a signal out to several callables (record + live progress)."""

    def __init__(self, *callbacks: Callable[[Signal], None]) -> None:
        self._callbacks = list(callbacks)

    def add(self, callback: Callable[[Signal], None]) -> None:
        self._callbacks.append(callback)

    def emit(self, signal: Signal) -> None:
        for callback in self._callbacks:
            callback(signal)
