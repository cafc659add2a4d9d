"""What a placement decided: the call's attribution and its explanation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubemoot.frozen import quick_init
from kubemoot.gates.record import DecisionRecord
from kubemoot.gates.results import GateResult, Outcome
from kubemoot.runtime.cost import Option
from kubemoot.runtime.refusals import Refusal
from kubemoot.store.documents import Ticket


class Action(StrEnum):
    """What the call does next."""

    WARM = "warm"  # runs now on a resident copy
    LOADING = "loading"  # runs on a copy another call is loading
    COLD_LOAD = "cold-load"  # loads the model onto free room, then runs
    UNLOAD = "unload"  # unloaded idle models, loads, then runs
    QUEUE = "queue"  # the cheapest option is to wait for a slot on a warm copy
    WAIT = "wait"  # no option now: wait for capacity (reason gpu-busy)
    REFUSE = "refuse"  # waiting cannot help (model-too-large, prompt-too-large)
    STATIC = "static"  # the agent's static endpoint: no shared state, or it cannot wait


CLAIMING_ACTIONS = frozenset({Action.WARM, Action.LOADING, Action.COLD_LOAD, Action.UNLOAD})


@dataclass(frozen=True, slots=True)
class CandidateModel:
    """A candidate model for the call with its quality score (preferred first in lists)."""

    model: str
    score: float = 0.0


class DeferredRecord:
    """A decision record built when first read in full (call it), with what the call
    log's summary reads of it at hand: the chosen candidate, the outcome, the reason and
    the failed gates. The call log summarises every call it keeps; building the whole
    record for that (every option's id, score and standing) was most of its cost.

    Whatever this says must be what the built record says (tests/runtime check it).
    """

    __slots__ = ()

    @property
    def chosen(self) -> str | None:
        """The record's ``chosen`` candidate id."""
        raise NotImplementedError

    @property
    def outcome(self) -> Outcome:
        """The record's ``outcome``."""
        raise NotImplementedError

    @property
    def reason(self) -> str:
        """The record's ``reason``."""
        raise NotImplementedError

    @property
    def scheduler_version(self) -> str:
        """The record's ``scheduler_version``."""
        raise NotImplementedError

    def __call__(self) -> DecisionRecord:
        raise NotImplementedError

    def failures(self) -> Iterator[tuple[str, GateResult]]:
        """Each candidate's FAILed gates, as ``(candidate id, gate)``, in the record's
        order (candidates as gathered, gates in gate order)."""
        raise NotImplementedError


@quick_init
@dataclass(frozen=True, slots=True)
class CallPlacement:
    """The result of one placement: where the call runs, or why it does not.

    ``provider``/``endpoint``/``model`` are the copy the call uses (for a queue decision:
    the copy it would wait for); ``evicted`` lists the models unloaded to make room;
    ``waited_seconds`` is filled by the capacity waiter; ``refusal`` says, with its
    facts, why a call that was not placed was not.
    """

    action: Action
    provider: str | None = None
    endpoint: str | None = None
    model: str | None = None
    ticket: Ticket | None = None
    evicted: tuple[str, ...] = ()
    refusal: Refusal | None = None
    options: tuple[Option, ...] = ()
    #: The decision record, or the way to build it on first use (:attr:`decision`): most
    #: placements' records are never read (the simulator keeps no call records), and a
    #: record of a busy fleet lists the gates of every option. A :class:`DeferredRecord`
    #: also answers the call log's summary without being built.
    explanation: DecisionRecord | Callable[[], DecisionRecord] | None = field(
        default=None, repr=False, compare=False
    )
    waited_seconds: float = 0.0
    context_length: int | None = None
    _built: DecisionRecord | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def decision(self) -> DecisionRecord | None:
        """The placement's decision record (gates of every option, scores, reason)."""
        given = self.explanation
        if given is None or isinstance(given, DecisionRecord):
            return given
        if self._built is None:
            object.__setattr__(self, "_built", given())
        return self._built

    @property
    def placed(self) -> bool:
        """Whether the call may run now (it holds a ticket, or uses the static endpoint)."""
        return self.ticket is not None or self.action is Action.STATIC

    @property
    def reason(self) -> str | None:
        """The refusal's wire name (``gpu-busy``, ``model-too-large``, ...), if any."""
        return self.refusal.reason.value if self.refusal is not None else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready and camelCase, the shape ``kubemoot place -o json`` prints."""
        return {
            "action": self.action.value,
            "provider": self.provider,
            "model": self.model,
            "evicted": list(self.evicted),
            "reason": self.reason,
            "options": [o.to_dict() for o in self.options],
            "decision": self.decision.to_dict() if self.decision is not None else {},
            "endpoint": self.endpoint,
            "ticketId": self.ticket.ticket_id if self.ticket is not None else None,
            "waitedSeconds": round(self.waited_seconds, 6),
            "contextLength": self.context_length,
        }
