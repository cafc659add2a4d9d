"""Waiting for GPU capacity: state-driven, never a polling sleep, first come first served.

A busy call (the answer was *queue* or *wait*) joins a **line**: the calls of this
process that ask for the same thing (same candidates, prompt size and ticket state),
oldest first. While it waits it holds ``wait.<model>.<agent>`` on the demand board, so
other agents' planners keep that model loaded. It says ``waiting`` (reason gpu-busy)
once, before it blocks, and ``evaluating`` when a retry finally claims a GPU.

One dispatcher per waiter object follows the capacity watch's change counter (every
probe publish, claim and release moves it). After each change it lets every line try
again, in order:

* the **head** places first — only when it is placed does the next call become head
  and try, so a freed slot goes to the oldest call that can use it, never to whichever
  waiter happened to wake first;
* then, while the head still queues, the **tail** (the call with the longest backlog
  before it) places: for it alone a second copy may now be cheaper than the queue, and
  when it is, it loads one (DESIGN §5's one comparison, with the calls ahead of it
  counted in the queue). Calls in between would see the same options with a shorter
  backlog, so they would queue as well and are not asked.

Every placement is told how many calls for the same preferred model wait before it
(``ahead``): they hold no ticket yet, but they take the slots first, so they are part
of the queue a copy has — the backlog DESIGN's ``queue(P, M)`` counts. A fresh call
counts every waiter already in line, so it cannot overtake them for a slot either.

A call gives up with reason gpu-busy when the discussion ends (the ``done`` event) or
at the wait limit, a safety net for a lost wake-up. Without a watch it gives up at
once: waiting without a wake source would only ever end at the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from kubemoot import metrics
from kubemoot.clock import Clock
from kubemoot.runtime.capacity import CapacityWatch, WatchUnavailable
from kubemoot.runtime.faults import tolerated
from kubemoot.runtime.options import could_help
from kubemoot.runtime.placement import Action, CallPlacement, CandidateModel
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.refusals import GpuBusy, Reason, Refusal, StateStale
from kubemoot.runtime.snapshot import FleetSnapshot
from kubemoot.store.documents import TicketState

log = logging.getLogger(__name__)


class WaitSignals(Protocol):
    """Where the waiter reports its progress (the agent runtime's signal publisher)."""

    async def waiting(self, *, model: str, reason: str) -> None: ...

    async def evaluating(self, *, model: str, provider: str) -> None: ...


class WaiterBoard(Protocol):
    """The part of the DemandBoard a waiter writes."""

    async def add_waiter(self, model: str, agent: str) -> None: ...

    async def remove_waiter(self, model: str, agent: str) -> None: ...


LineKey = tuple[tuple[CandidateModel, ...], int | None, TicketState, frozenset[str]]
"""Candidates, prompt tokens, ticket state and the providers the call must avoid."""


@dataclass(eq=False, slots=True)
class _Waiter:
    """One call in a line."""

    seq: int
    key: LineKey
    holder: str
    deadline: float
    last: CallPlacement  # the latest answer that did not place it
    future: asyncio.Future[CallPlacement | None] = field(repr=False)
    in_line: bool = True

    @property
    def model(self) -> str:
        return self.key[0][0].model


class CapacityWaiter:
    """Places calls, keeping busy ones in first-come lines until capacity appears."""

    def __init__(
        self,
        planner: CallPlanner,
        *,
        clock: Clock,
        watch: CapacityWatch | None,
        board: WaiterBoard | None = None,
        limit_seconds: float | None = None,
    ) -> None:
        self._planner = planner
        self._clock = clock
        self._watch = watch
        self._board = board
        self._limit = (
            planner.settings.gpu_wait_limit_seconds if limit_seconds is None else limit_seconds
        )
        self._lines: dict[LineKey, deque[_Waiter]] = {}
        self._waiting: dict[str, list[int]] = {}  # preferred model → seqs in line, sorted
        self._seq = itertools.count()
        self._dispatcher: asyncio.Task[None] | None = None
        self._seen: dict[LineKey, int] = {}  # fleet generation each line last looked at

    # -- public ----------------------------------------------------------------------

    def waiting_for(self, model: str) -> int:
        """How many calls preferring ``model`` wait in this process's lines."""
        return len(self._waiting.get(model, ()))

    async def place(
        self,
        candidates: Sequence[CandidateModel],
        *,
        agent: str,
        holder_id: str | None = None,
        prompt_tokens: int | None = None,
        signals: WaitSignals | None = None,
        done: asyncio.Event | None = None,
        ticket_state: TicketState = TicketState.RUNNING,
        exclude: Collection[str] = (),
    ) -> CallPlacement:
        """A placement that holds a ticket, or the reason the agent stands aside.

        ``exclude``: providers the call must not go to (see :meth:`CallPlanner.place`).
        """
        holder = holder_id or agent
        avoid = frozenset(exclude)
        key: LineKey = (tuple(candidates), prompt_tokens, ticket_state, avoid)
        model = candidates[0].model
        started = self._clock.now()
        # A watch that never started (the store cannot watch) is no wake source.
        watch = self._watch if self._watch is not None and self._watch.started else None
        counter = watch.counter if watch is not None else 0
        placement = await self._planner.place(
            candidates, holder_id=holder, prompt_tokens=prompt_tokens,
            ticket_state=ticket_state, ahead=self.waiting_for(model), exclude=avoid,
        )
        # The fleet this answer saw, unless something changed while it was made (then
        # the line looks at everything once more).
        quiet = watch is not None and watch.counter == counter
        generation = self._planner.view.generation if quiet else 0
        if placement.placed or placement.action is Action.REFUSE:
            return _waited(placement, self._clock.now() - started)
        if watch is None or (done is not None and done.is_set()):
            given = _gave_up(placement, self._clock.now() - started)
            metrics.REFUSALS.labels(reason=given.reason or Reason.GPU_BUSY.value).inc()
            return given
        metrics.WAITS.inc()
        waiter = self._join(key, holder, started + self._limit, placement)
        self._seen[key] = min(self._seen.get(key, generation), generation)
        outcome = "gave-up"
        given_up = Reason.GPU_BUSY.value  # what a give-up is counted as
        try:
            if self._board is not None:
                with tolerated("waiter", f"announcing {agent} waiting for {model}"):
                    await self._board.add_waiter(model, agent)
            if signals is not None:
                # waiting for a fresh probe of a stale provider is not waiting on a busy GPU
                await signals.waiting(model=model, reason=(
                    Reason.STATE_STALE.value if isinstance(placement.refusal, StateStale)
                    else Reason.GPU_BUSY.value))
            if watch.counter != counter:
                watch.notify()  # a change came while this call joined: look again
            result = await self._wait(waiter, done)
            elapsed = self._clock.now() - started
            if result is None:
                given = _gave_up(waiter.last, elapsed)
                given_up = given.reason or given_up
                return given
            if result.placed:
                outcome = "placed"
                if signals is not None and result.provider is not None:
                    await signals.evaluating(model=result.model or model,
                                             provider=result.provider)
            else:
                outcome = "refused"
            return _waited(result, elapsed)
        finally:
            self._leave(waiter)
            metrics.WAIT_SECONDS.labels(outcome=outcome).observe(self._clock.now() - started)
            if outcome == "gave-up":
                metrics.REFUSALS.labels(reason=given_up).inc()
            if self._board is not None:
                with tolerated("waiter", f"withdrawing {agent} waiting for {model}"):
                    await self._board.remove_waiter(model, agent)

    # -- the lines -------------------------------------------------------------------

    def _join(self, key: LineKey, holder: str, deadline: float, last: CallPlacement) -> _Waiter:
        future: asyncio.Future[CallPlacement | None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(next(self._seq), key, holder, deadline, last, future)
        self._lines.setdefault(key, deque()).append(waiter)
        insort(self._waiting.setdefault(waiter.model, []), waiter.seq)
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        return waiter

    def _leave(self, waiter: _Waiter) -> None:
        if not waiter.in_line:
            return
        waiter.in_line = False
        line = self._lines.get(waiter.key)
        if line is not None:
            with contextlib.suppress(ValueError):
                line.remove(waiter)
            if not line:
                del self._lines[waiter.key]
                self._seen.pop(waiter.key, None)
        seqs = self._waiting.get(waiter.model)
        if seqs is not None:
            at = bisect_left(seqs, waiter.seq)
            if at < len(seqs) and seqs[at] == waiter.seq:
                del seqs[at]
            if not seqs:
                del self._waiting[waiter.model]

    def _ahead(self, waiter: _Waiter) -> int:
        return bisect_left(self._waiting.get(waiter.model, []), waiter.seq)

    async def _wait(self, waiter: _Waiter, done: asyncio.Event | None) -> CallPlacement | None:
        """The dispatcher's answer, or ``None`` at the limit or when the discussion ends."""
        stopper: asyncio.Task[Literal[True]] | None = None
        if done is not None:
            stopper = asyncio.ensure_future(done.wait())
            stopper.add_done_callback(lambda _f: _settle(waiter.future, None))
        try:
            remaining = waiter.deadline - self._clock.now()
            return await self._clock.wait_for(asyncio.shield(waiter.future), max(0.0, remaining))
        except TimeoutError:
            return None
        finally:
            if stopper is not None and not stopper.done():
                stopper.cancel()
                with contextlib.suppress(BaseException):
                    await stopper
            _settle(waiter.future, None)

    # -- the dispatcher --------------------------------------------------------------

    async def _dispatch(self) -> None:
        """After each capacity change, let every line try again (module docstring)."""
        assert self._watch is not None
        seen = self._watch.counter
        try:
            while self._lines:
                try:
                    seen = await self._watch.changed_since(seen, None)
                except WatchUnavailable:
                    for line in list(self._lines.values()):
                        for waiter in list(line):
                            _settle(waiter.future, None)  # no wake source: give up
                    return
                # Changes of one instant come together (a release and the probe after
                # it); look once they are all in.
                await asyncio.sleep(0)
                seen = self._watch.counter
                self._planner.invalidate()
                await self._round()
        except Exception:  # a bug must not leave every waiter hanging until its limit
            metrics.survived("runtime", "capacity-dispatcher", metrics.BUG,
                             "capacity dispatcher failed", logger=log, exc_info=True)
            for line in list(self._lines.values()):
                for waiter in list(line):
                    _settle(waiter.future, None)

    async def _round(self) -> None:
        now = self._clock.now()
        view = self._planner.view
        fleet = await view.snapshot()  # takes in what changed
        for key in sorted(self._lines, key=lambda k: self._lines[k][0].seq):
            line = self._lines.get(key)
            if not line:
                continue
            for waiter in [w for w in line if w.deadline <= now]:
                _settle(waiter.future, None)  # its limit passed; it leaves by itself
            changed = view.changed_since(self._seen.get(key, 0))
            if changed is not None and not self._could_help(key, line, fleet, changed):
                continue
            self._seen[key] = view.generation
            head_queues = False
            while line and not head_queues:
                head_queues = not await self._try(line[0])
            while head_queues and len(line) > 1:
                if not await self._try(line[-1]):
                    break

    def _could_help(
        self, key: LineKey, line: deque[_Waiter], fleet: FleetSnapshot,
        changed: frozenset[str],
    ) -> bool:
        """Whether a change on ``changed`` providers can give this line a better option
        (:func:`~kubemoot.runtime.options.could_help`); nothing else wakes the line."""
        if not changed:
            return False  # before occupancy is looked up: that observes the fleet
        planner = self._planner
        models = [c.model for c in planner.in_tolerance(key[0])]
        queued = line[-1].last.options  # the longest backlog decides what could help
        sizes = [planner.occupancy.occupancy(m, fleet) for m in models]
        known = [s for s in sizes if s is not None]
        return could_help(
            fleet, models, changed, best=queued[0].seconds if queued else float("inf"),
            occupancy=sizes[0], settings=planner.settings,
            smallest_mib=min(known) if known else None,
        )

    async def _try(self, waiter: _Waiter) -> bool:
        """Place ``waiter`` again; True when it left the line (placed, refused or gone)."""
        if waiter.future.done():
            self._leave(waiter)
            return True
        model_candidates, prompt_tokens, ticket_state, avoid = waiter.key
        placement = await self._planner.place(
            model_candidates, holder_id=waiter.holder, prompt_tokens=prompt_tokens,
            ticket_state=ticket_state, ahead=self._ahead(waiter), exclude=avoid,
        )
        if placement.placed or placement.action is Action.REFUSE:
            self._leave(waiter)
            if not _settle(waiter.future, placement) and placement.ticket is not None:
                await self._planner.release(placement)  # it gave up meanwhile
            return True
        waiter.last = placement
        if waiter.future.done():
            self._leave(waiter)
            return True
        return False


def _settle(future: asyncio.Future[CallPlacement | None], value: CallPlacement | None) -> bool:
    """Resolve the future unless it already is; whether this call resolved it."""
    if future.done():
        return False
    future.set_result(value)
    return True


def _waited(p: CallPlacement, seconds: float) -> CallPlacement:
    """``replace(p, waited_seconds=seconds)`` spelt out: every placed call passes here,
    and ``dataclasses.replace`` reads each field through Python (about fifteen calls
    per call). Every field of ``CallPlacement`` is passed on (tests/runtime/test_waited.py
    checks that none is forgotten); the record built on first read is built again."""
    return CallPlacement(
        p.action, provider=p.provider, endpoint=p.endpoint, model=p.model, ticket=p.ticket,
        evicted=p.evicted, refusal=p.refusal, options=p.options, explanation=p.explanation,
        waited_seconds=seconds, context_length=p.context_length,
    )


def _gave_up(placement: CallPlacement, elapsed: float) -> CallPlacement:
    """Stand aside with gpu-busy (keeping the options for the explanation), or with the
    stale states the call waited on to be refreshed: those are not busy GPUs."""
    refusal = placement.refusal
    given: Refusal = (replace(refusal, waited=elapsed) if isinstance(refusal, StateStale)
                      else GpuBusy(waited=elapsed))
    return replace(
        placement, action=Action.WAIT, refusal=given, ticket=None,
        waited_seconds=elapsed,
    )
