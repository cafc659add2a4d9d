"""Planning at selection: place the first mulling call as soon as an agent is selected.

:meth:`HeldPlans.commit_to_thread` runs the moment a coordinator picks an agent
for a thread. It announces the models the agent will want (intents), feeds the demand
forecast with the selection, and plans the agent's first mulling call right away with a
guessed prompt size; the ticket that plan claims is kept as a *held* plan. A model that
is not on the planned card yet starts loading immediately, while triage runs. Because
every plan is a ticket and every intent is on the demand board, plans made at about the
same time account for one another, and agents wanting the same model end up sharing a
copy instead of loading several.

Only a plan that starts a load is held. A plan that would share a copy already resident
or coming (with a free slot) is not claimed at all: the intents are published and the
first call places itself when it comes.

Held or not, every plan *counts*: the copy it plans on is noted until the first call
comes, and each later plan sees those first calls as calls queued ahead on their
copies (``CallPlanner.place(planned=…)``). Neither kind takes a slot by itself (a held
ticket is not a call, an unheld plan has no ticket), so without the count every agent
selected in the same instant counted on the same free slot and none loaded a copy of
its own (memory-tight cut: 4.03 s → see docs/runtime.md).

The forecast. Each selection is recorded with the agent's *selection frequency*: the
share of the threads this planner saw within ``selection_window_seconds`` that selected
the agent. An agent in every thread forecasts 1 for its models, one in every fourth
thread 0.25. When a new thread appears every known agent's share changes, so their
entries are written again then (one small write per agent per thread).

The first mulling call takes the plan (:meth:`take`) when its provider is still ready
and its context holds the real prompt; otherwise the plan is released and the call
places afresh. A plan is released when the agent stands aside or fails
(:meth:`release`), when the thread closes (:meth:`close_thread`), or after the held-plan
TTL (3 minutes) as a safety net (:meth:`expire`, run on every operation).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from kubemoot.clock import Clock
from kubemoot.providers.protocol import ProviderError
from kubemoot.runtime import faults, filters, options
from kubemoot.runtime.cost import OptionKind
from kubemoot.runtime.faults import tolerated
from kubemoot.runtime.lease import Lease
from kubemoot.runtime.placement import Action, CallPlacement, CandidateModel
from kubemoot.runtime.planner import CallPlanner
from kubemoot.runtime.tickets import TicketGone
from kubemoot.store.documents import TicketState
from kubemoot.store.protocol import StoreError

# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read, a module global about 150): these are
# read for each copy a selection's plan looks at.
_WARM, _WARM_ACTION, _LOADING_ACTION = OptionKind.WARM, Action.WARM, Action.LOADING

log = logging.getLogger(__name__)

#: A new thread lowers every other known agent's share a little; an agent's entry is
#: written again only once its share has moved by more than this part of what the
#: board holds. Rewriting every agent on every thread made the board's writes grow
#: with agents × threads (fleet-16: 12,172 writes in an hour, against 1,045
#: selections), and the forecast only orders victims and weighs their reloads.
SHARE_TOLERANCE = 0.1


class SelectionBoard(Protocol):
    """The part of the DemandBoard selection writes."""

    async def add_intent(self, model: str, agent: str) -> None: ...

    async def remove_intent(self, model: str, agent: str) -> None: ...

    async def record_selection(
        self, agent: str, models: Sequence[str], frequency: float
    ) -> None: ...


@dataclass(slots=True)
class HeldPlan:
    """A placement made at selection, waiting for the agent's first mulling call."""

    agent: str
    thread: str
    placement: CallPlacement
    held_at: float
    models: tuple[str, ...]
    preload: asyncio.Task[None] | None = field(default=None, repr=False)
    #: Renews the held ticket until the plan is taken or dropped.
    lease: Lease | None = field(default=None, repr=False)


class HeldPlans:
    """Holds plans per (agent, thread)."""

    def __init__(
        self,
        planner: CallPlanner,
        *,
        clock: Clock,
        board: SelectionBoard | None = None,
    ) -> None:
        self._planner = planner
        self._clock = clock
        self._board = board
        self._plans: dict[tuple[str, str], HeldPlan] = {}
        self._intents: dict[tuple[str, str], tuple[str, ...]] = {}
        # The forecast's counts: when each thread was first seen, and per agent the
        # threads that selected it and the models it named last.
        self._threads: dict[str, float] = {}
        self._selected: dict[str, dict[str, float]] = {}
        #: len() of each agent's threads in _selected, kept beside it: a new thread reads
        #: every known agent's count (fleet-16: about 24,000 a run)
        self._counts: dict[str, int] = {}
        self._models_of: dict[str, tuple[str, ...]] = {}
        self._written: dict[str, float] = {}  # the share last written per agent
        #: Per (agent, thread), the copy its plan counts on and when it was planned,
        #: held or not, until the first mulling call comes (see the module docstring).
        self._planned: dict[tuple[str, str], tuple[str, str, float]] = {}

    def held(self, agent: str, thread: str) -> HeldPlan | None:
        return self._plans.get((agent, thread))

    def planned(self) -> dict[tuple[str, str], int]:
        """First calls planned per copy ``(provider, model)`` that have not come yet."""
        return dict(Counter((provider, model) for provider, model, _at in self._planned.values()))

    async def commit_to_thread(
        self,
        agent: str,
        thread: str,
        candidates: Sequence[CandidateModel],
        *,
        frequency: float | None = None,
        prompt_tokens: int | None = None,
    ) -> CallPlacement:
        """Publish intents, record the selection and hold a plan for the first call.

        ``frequency`` overrides the agent's measured selection frequency.
        """
        await self.expire()
        await self.release(agent, thread)  # a re-selection replaces the old plan
        models = tuple(dict.fromkeys(c.model for c in candidates))
        new_thread = self._count_selection(agent, thread, models)
        if self._board is not None:
            with tolerated("intent", f"publishing the intents of {agent}"):
                for model in models:
                    await self._board.add_intent(model, agent)
            # A new thread changes every known agent's share: write again the ones that
            # moved by more than SHARE_TOLERANCE of what the board holds.
            others = [a for a in self._selected if a != agent] if new_thread else []
            # frequency(), inline, and without a call per agent but len: a new thread
            # asks it of every known agent (fleet-16: about 24,000 times a run). The
            # dicts are read as the loop reaches each agent, as they change meanwhile.
            threads, counts, written_of = len(self._threads), self._counts, self._written
            for who in [agent, *others]:
                share = counts[who] / threads if threads and who in counts else 0.0
                if who == agent:
                    if frequency is not None:
                        share = frequency
                elif who in written_of:
                    # abs(share - written) <= SHARE_TOLERANCE * written, spelt out
                    written = written_of[who]
                    moved, tolerated_move = share - written, SHARE_TOLERANCE * written
                    if -tolerated_move <= moved <= tolerated_move:
                        continue
                # tolerated(), spelt out: a context manager per write (fleet-16: about
                # 1,900 a run) costs a generator and three frames
                try:
                    await self._board.record_selection(who, self._models_of[who], share)
                    self._written[who] = share
                except StoreError as error:
                    faults.noted("selection", faults.STORE,
                                 f"recording the selection of {who}", error)
        self._intents[(agent, thread)] = models
        assumed = prompt_tokens or self._planner.settings.assumed_prompt_tokens
        planned = self.planned()
        shared = await self._shares_a_copy(candidates, assumed, planned)
        if shared is not None:
            self._count_plan(agent, thread, shared)
            return shared  # nothing to hold (see below): the first call places itself
        placement = await self._planner.place(
            candidates, holder_id=f"{agent}@{thread}", prompt_tokens=assumed,
            ticket_state=TicketState.HELD, planned=planned,
        )
        self._count_plan(agent, thread, placement)
        if placement.ticket is None:
            return placement  # nothing held: the first call places (and waits) itself
        if placement.action not in (Action.COLD_LOAD, Action.UNLOAD):
            # A copy that is already there or coming gains nothing from being planned
            # ahead. Held, the plan would send the first call to the copy chosen at
            # selection even when the calls placed during triage (a held plan takes no
            # slot) have filled its slots since: it would queue in the engine, unseen.
            # So only a plan that starts a load is held; the first call places when it
            # comes (a scratch run of bench/quality.py holding every plan: fleet-16 1.06 s
            # mean wait, against 0.62 s holding only loads).
            await self._planner.release(placement)
            return placement
        plan = HeldPlan(agent, thread, placement, self._clock.now(), models)
        assert placement.provider is not None
        # Held for as long as the plan lives (up to the held-plan TTL), which may be
        # longer than the ticket's own TTL.
        plan.lease = self._planner.tickets.lease(
            placement.provider, placement.ticket.ticket_id
        )
        plan.lease.start()
        if placement.action in (Action.COLD_LOAD, Action.UNLOAD):
            plan.preload = self._start_preload(placement)
        self._plans[(agent, thread)] = plan
        return placement

    def _count_plan(self, agent: str, thread: str, placement: CallPlacement) -> None:
        """Note the copy the plan counts on (none for a plan that has to wait)."""
        if placement.provider is not None and placement.model is not None:
            self._planned[(agent, thread)] = (placement.provider, placement.model,
                                              self._clock.now())

    async def _shares_a_copy(
        self, candidates: Sequence[CandidateModel], prompt_tokens: int,
        planned: dict[tuple[str, str], int],
    ) -> CallPlacement | None:
        """The copy the plan would share, when one is resident or coming with a slot
        that no call and no earlier plan counts on (DESIGN §5's cheap cases, which win
        before any load is priced); ``None`` when the plan has to be placed. Such a plan
        is not held, so it is not claimed either: a claim given back at once would only
        wake the calls waiting in line."""
        planner = self._planner
        rnd = await planner.new_round(prompt_tokens)
        options.count_planned(rnd, planned)
        models = [c.model for c in planner.in_tolerance(candidates)]
        for find in (options.warm_options, options.joinable_loading):  # steps 1-2, then 3
            for model in models:
                found = find(rnd, model)
                if found and options.or_a_copy_as_soon(rnd, found) is not found:
                    return None  # a copy of its own would be as soon: place() loads it
                for option in found:
                    action = _WARM_ACTION if option.kind is _WARM else _LOADING_ACTION
                    return CallPlacement(action, provider=option.provider,
                                         model=option.model, options=(option,))
        return None

    def _count_selection(self, agent: str, thread: str, models: tuple[str, ...]) -> bool:
        """Count the selection in the forecast; whether ``thread`` is new."""
        now = self._clock.now()
        self._forget_before(now - self._planner.settings.selection_window_seconds)
        new_thread = thread not in self._threads
        self._threads.setdefault(thread, now)
        threads = self._selected.setdefault(agent, {})
        threads[thread] = now
        self._counts[agent] = len(threads)
        self._models_of[agent] = models
        return new_thread

    def _forget_before(self, start: float) -> None:
        # Threads are kept in the order they were first seen, so the first is the
        # oldest: when it is still in the window, nothing is to be forgotten.
        oldest = next(iter(self._threads.values()), None)
        if oldest is None or oldest >= start:
            return
        self._threads = {t: at for t, at in self._threads.items() if at >= start}
        for agent in list(self._selected):
            kept = {t: at for t, at in self._selected[agent].items() if t in self._threads}
            if kept:
                self._selected[agent] = kept
                self._counts[agent] = len(kept)
            else:
                del self._selected[agent]
                del self._counts[agent]
                self._models_of.pop(agent, None)
                self._written.pop(agent, None)

    def frequency(self, agent: str) -> float:
        """The share of the threads in the window that selected ``agent`` (0 to 1)."""
        if not self._threads:
            return 0.0
        return len(self._selected.get(agent, {})) / len(self._threads)

    def _start_preload(self, placement: CallPlacement) -> asyncio.Task[None] | None:
        client = self._planner.clients.get(placement.provider or "")
        if client is None or placement.model is None:
            return None
        model = placement.model

        async def preload() -> None:
            try:
                await client.preload(model)
            except ProviderError as error:  # the call will find out and re-plan
                log.warning("preload of %s on %s failed: %s", model, client.name, error)

        return asyncio.get_running_loop().create_task(preload())

    async def take(
        self, agent: str, thread: str, *, prompt_tokens: int | None = None
    ) -> CallPlacement | None:
        """The held plan for the first mulling call, or ``None`` (place afresh)."""
        await self.expire()
        self._planned.pop((agent, thread), None)  # the call is here: it counts itself
        plan = self._plans.pop((agent, thread), None)
        if plan is None:
            return None
        if plan.lease is not None:
            await plan.lease.stop()  # the call's own lease takes over
        placement = plan.placement
        assert placement.ticket is not None and placement.provider is not None
        view = self._planner.view
        view.invalidate(placement.provider)
        fleet = await view.snapshot()
        p = fleet.provider(placement.provider)
        still_good = p is not None and filters.feasible([
            filters.ready_gate(p),
            filters.circuit_gate(p),
            filters.context_gate(p, placement.model or "", prompt_tokens),
        ])
        if not still_good or p is None:
            await self._planner.release(placement)
            return None
        state = (TicketState.RUNNING if p.is_resident(placement.model or "")
                 else TicketState.LOADING)
        try:
            ticket = await self._planner.tickets.update_state(
                placement.provider, placement.ticket.ticket_id, state
            )
        except TicketGone:
            return None  # gone meanwhile: the call places afresh
        return replace(placement, ticket=ticket)  # the state change renewed its expiry

    async def release(self, agent: str, thread: str) -> None:
        """The agent's evaluation ended without the plan (stood aside or failed)."""
        self._planned.pop((agent, thread), None)
        plan = self._plans.pop((agent, thread), None)
        if plan is not None:
            await self._drop(plan)
        models = self._intents.pop((agent, thread), ())
        if self._board is not None:
            with tolerated("intent", f"withdrawing the intents of {agent}"):
                for model in models:
                    await self._board.remove_intent(model, agent)

    async def close_thread(self, thread: str) -> None:
        """The thread closed: every plan made for it goes."""
        for agent, plan_thread in [k for k in {*self._plans, *self._intents} if k[1] == thread]:
            await self.release(agent, plan_thread)

    async def expire(self) -> int:
        """Release plans held longer than the held-plan TTL; returns how many."""
        ttl = self._planner.settings.held_plan_ttl_seconds
        now = self._clock.now()
        old = [k for k, plan in self._plans.items() if now - plan.held_at >= ttl]
        for key in old:
            await self._drop(self._plans.pop(key))
        # An unheld plan whose first call never came stops counting after the same TTL.
        for key in [k for k, (_p, _m, at) in self._planned.items() if now - at >= ttl]:
            del self._planned[key]
        return len(old)

    async def _drop(self, plan: HeldPlan) -> None:
        if plan.lease is not None:
            await plan.lease.stop()
        if plan.preload is not None and not plan.preload.done():
            plan.preload.cancel()
        await self._planner.release(plan.placement)
