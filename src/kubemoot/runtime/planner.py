"""CallPlanner.place: where one inference call runs, decided at the moment of the call.

The order (DESIGN §5) keeps the spec's cheap cases first:

1. the preferred model warm with a free slot;
2. an in-tolerance candidate warm with a free slot, highest score first (no load,
   no eviction, so it beats cold-loading the preferred model);
3. an in-tolerance candidate another call is loading right now (converge on it: join
   it with a free slot, or queue at it when its slots are taken);

then **one comparison** in seconds over what is left: queueing at a warm copy of the
preferred model or an in-tolerance candidate, cold-loading the preferred model onto
free room, and unload plans for it. Ties: warm, then cold, then unload; then provider
name. A queue decision claims nothing: the caller waits for the next capacity change
and places again, so a better option that appears meanwhile wins. With no option at
all the refusal is classified (busy, model too large, prompt too large).

Each step prices with :mod:`kubemoot.runtime.options` (pure) and claims the pick with
:class:`kubemoot.runtime.claims.Claims`; a claim the state no longer allows falls to
the next choice, and a round whose final pick is refused is priced again afresh.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from kubemoot import metrics
from kubemoot.gates.record import DecisionRecord
from kubemoot.gates.results import GateResult, Outcome, Verdict
from kubemoot.providers.protocol import ProviderClient
from kubemoot.runtime import faults, options
from kubemoot.runtime.claims import Claim, Claims
from kubemoot.runtime.cost import Option, OptionKind
from kubemoot.runtime.lease import Lease
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.options import Evidence, Round, evidence
from kubemoot.runtime.placement import Action, CallPlacement, CandidateModel, DeferredRecord
from kubemoot.runtime.prefix import PrefixBook
from kubemoot.runtime.record import SCHEDULER_VERSION, build_record, option_id
from kubemoot.runtime.refusals import GpuBusy, Reason, Refusal, classify
from kubemoot.runtime.snapshot import DemandSnapshot
from kubemoot.runtime.tickets import TicketManager
from kubemoot.runtime.view import ProviderView
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import Ticket, TicketState
from kubemoot.store.protocol import Bucket, StoreError

log = logging.getLogger(__name__)

_ACTION_OF = {
    OptionKind.WARM: Action.WARM,
    OptionKind.LOADING: Action.LOADING,
    OptionKind.QUEUE: Action.LOADING,  # joining a loading copy whose slots are taken
    OptionKind.COLD_LOAD: Action.COLD_LOAD,
    OptionKind.UNLOAD: Action.UNLOAD,
}


#: Each action's series of the decisions counter, made on its first decision.
_DECIDED: dict[Action, Any] = {}
# Enum members read through their class go through EnumType.__getattr__'s hook on
# Python 3.11 (about 850 instructions a read under callgrind, a module global about
# 150): the members read once or more per call are kept at module level.
_HELD, _REFUSE, _QUEUE = TicketState.HELD, Action.REFUSE, OptionKind.QUEUE
_REUSED = (OptionKind.WARM, OptionKind.LOADING)


class _PlacedRecord(DeferredRecord):
    """A placed call's decision record, built when first read in full; the call log's
    summary reads the chosen option, the reason and the failed gates without it."""

    __slots__ = ("_gathered", "_option", "_options", "_why")

    def __init__(
        self, option: Option, options: tuple[Option, ...], gathered: dict[str, Evidence],
        why: str,
    ) -> None:
        self._option = option
        self._options = options
        self._gathered = gathered
        self._why = why

    @property
    def chosen(self) -> str:
        # the record names the first option of the claimed one's provider, model and
        # kind, and an option's id is made of just those three
        return option_id(self._option)

    @property
    def outcome(self) -> Outcome:
        return Outcome.PLACE

    @property
    def reason(self) -> str:
        option = self._option
        return f"{self._why}; {option.provider} for {option.model} at {option.seconds:.3f} s"

    @property
    def scheduler_version(self) -> str:
        return SCHEDULER_VERSION

    def failures(self) -> Iterator[tuple[str, GateResult]]:
        for cid, results in self._gathered.items():
            # Warm gates still to work out are those of copies that passed the warm
            # filter (Round.record_warm), and ``warm_ok`` is ``feasible(warm_gates)``
            # (tests/runtime/test_warm_fast_path.py): none of them FAILs, so the summary
            # need not work them out; the record does when it is built.
            if isinstance(results, list):
                for gate in results:
                    if gate.result is Verdict.FAIL:
                        yield cid, gate

    def __call__(self) -> DecisionRecord:
        option, options = self._option, self._options
        chosen = next(
            (o for o in options if (o.provider, o.model, o.kind) ==
             (option.provider, option.model, option.kind)),
            option,
        )
        return build_record(
            subject=f"call:{option.model}", gates=evidence(self._gathered), options=options,
            chosen=chosen, outcome=self.outcome, reason=self.reason,
        )


class DemandSource(Protocol):
    """Where demand comes from (the DemandBoard)."""

    async def snapshot(self) -> DemandSnapshot: ...


class CallPlanner:
    """Places calls; one instance per process, shared by all its agents."""

    def __init__(
        self,
        view: ProviderView,
        tickets: TicketManager,
        *,
        states: Bucket,
        settings: RuntimeSettings | None = None,
        occupancy: OccupancyBook | None = None,
        demand: DemandSource | None = None,
        clients: Mapping[str, ProviderClient] | None = None,
        max_rounds: int = 4,
    ) -> None:
        self.view = view  # the fleet this planner reads
        self.tickets = tickets  # where its claims go
        self.settings = settings or RuntimeSettings()
        self.occupancy = occupancy or OccupancyBook(settings=self.settings)
        self._demand = demand
        # ``is None``, not ``or``: an empty live mapping (a directory filled later) is kept.
        self.clients: Mapping[str, ProviderClient] = clients if clients is not None else {}
        self.claims = Claims(view, tickets, states=states, clients=self.clients)
        self._max_rounds = max_rounds
        self._demand_seen: DemandSnapshot | None = None
        self._demand_read_at = float("-inf")
        #: what the engines' prompt caches hold by this process's records (None: calls
        #: are priced without prefill, as DESIGN §5's formulas are)
        self.prefix: PrefixBook | None = None

    def invalidate(self) -> None:
        """Forget cached provider state (after a capacity change another process made).

        Demand keeps its own cache window: it only orders victims and weighs reloads,
        and re-reading the whole board on every capacity change would cost more than
        the placement itself.
        """
        if not self.view.following:
            self.view.invalidate()

    async def _demand_view(self) -> DemandSnapshot:
        # Demand changes slowly and only orders victims, so it shares the state cache window.
        now = self.view.clock.now()
        seen = self._demand_seen
        if seen is None or now - self._demand_read_at >= self.settings.demand_cache_seconds:
            seen = DemandSnapshot()
            if self._demand is not None:
                try:
                    seen = await self._demand.snapshot()
                except StoreError as error:  # demand only orders victims; go on without it
                    faults.noted("demand", faults.STORE, "demand board unreadable", error)
            self._demand_seen, self._demand_read_at = seen, now
        return seen

    def in_tolerance(self, candidates: Sequence[CandidateModel]) -> list[CandidateModel]:
        """The preferred model, then the others within tolerance, highest score first."""
        preferred, rest = candidates[0], candidates[1:]
        floor = preferred.score - self.settings.candidate_tolerance
        close = [c for c in rest if c.score >= floor and c.model != preferred.model]
        if len(close) > 1:
            close.sort(key=lambda c: -c.score)
        return [preferred, *close]

    async def new_round(
        self, prompt_tokens: int | None, *, exclude: Collection[str] = ()
    ) -> Round:
        """A round over the fleet and the demand as they are now, less ``exclude``."""
        fleet = await self.view.snapshot()
        demand = await self._demand_view()
        return Round.of(fleet, demand, settings=self.settings, occupancy=self.occupancy,
                        prompt_tokens=prompt_tokens, exclude=exclude)

    async def place(
        self,
        candidates: Sequence[CandidateModel],
        *,
        holder_id: str,
        prompt_tokens: int | None = None,
        ticket_state: TicketState = TicketState.RUNNING,
        explain: bool = False,
        ahead: int = 0,
        exclude: Collection[str] = (),
        planned: Mapping[tuple[str, str], int] | None = None,
    ) -> CallPlacement:
        """Place one call of the first (preferred) candidate or a tolerated alternative.

        ``ahead`` is how many calls for the same preferred model are queued before this
        one without a ticket yet (the capacity waiter's line): they take slots first, so
        they count in every copy's queue. With ``explain`` every option is priced even
        when a warm copy wins at once (for ``kubemoot place``); otherwise the cheap
        cases skip the full comparison and options that cannot win are not listed.
        ``exclude`` names providers this call must not go to (its connection was refused
        there before any byte was sent): they are left out of every round.
        ``planned`` counts, per copy ``(provider, model)``, the first calls of agents
        already planned onto it at selection (:class:`~kubemoot.runtime.held_plans.HeldPlans`):
        those calls hold no slot yet, but they will take one when they come, so each
        counts like a call queued ahead on that copy.
        """
        clock = self.view.clock
        began = clock.now()
        placement = await self._place(candidates, holder_id=holder_id,
                                      prompt_tokens=prompt_tokens, ticket_state=ticket_state,
                                      explain=explain, ahead=ahead, exclude=exclude,
                                      planned=planned or {})
        metrics.PLACEMENT_SECONDS.observe(max(0.0, clock.now() - began))
        decided = _DECIDED.get(placement.action)
        if decided is None:  # labels() validates and locks each time: look it up once
            decided = _DECIDED[placement.action] = metrics.DECISIONS.labels(
                action=placement.action.value)
        decided.inc()
        if placement.action is _REFUSE and placement.reason is not None:
            metrics.REFUSALS.labels(reason=placement.reason).inc()
        return placement

    async def _place(
        self,
        candidates: Sequence[CandidateModel],
        *,
        holder_id: str,
        prompt_tokens: int | None,
        ticket_state: TicketState,
        explain: bool,
        ahead: int,
        exclude: Collection[str],
        planned: Mapping[tuple[str, str], int],
    ) -> CallPlacement:
        if not candidates:
            raise ValueError("a call needs at least one candidate model")
        acceptable = self.in_tolerance(candidates)
        models = [c.model for c in acceptable]
        async def prepared() -> Round:
            rnd = await self.new_round(prompt_tokens, exclude=exclude)
            rnd.cost.at_selection = ticket_state is _HELD  # a plan at selection
            self._prefill(rnd, holder_id)
            options.spread(rnd, models, ahead)
            options.count_planned(rnd, planned)
            return rnd

        for _ in range(self._max_rounds):
            rnd = await prepared()
            placement = await self._place_round(rnd, models, holder_id, ticket_state, explain)
            if placement is not None and not await self.admit(placement):
                continue  # a half-open provider's one trial went to another call
            if placement is not None:
                return placement
        # Every round lost its claim to a concurrent change: treat it as busy.
        rnd = await prepared()  # priced as the rounds were
        return self._unplaced(rnd, models, options.comparison(rnd, models, explain=True),
                              GpuBusy())

    def _prefill(self, rnd: Round, holder_id: str) -> None:
        """Price the call's prefill per copy when a prefix book knows its thread."""
        if self.prefix is not None:
            rnd.prefill = self.prefix.seconds(holder_id, rnd.fleet)

    async def _place_round(
        self, rnd: Round, models: list[str], holder_id: str, state: TicketState, explain: bool
    ) -> CallPlacement | None:
        """Price, pick, claim: the cheap cases in DESIGN §5's order, then the comparison."""
        priced = options.comparison(rnd, models, explain=True) if explain else []
        cheap_cases = itertools.chain(  # priced one model at a time, only while unclaimed
            (options.warm_options(rnd, m) for m in models),  # steps 1 and 2
            (options.joinable_loading(rnd, m) for m in models),  # step 3, a free slot
        )
        for choices in cheap_cases:
            choices = options.or_a_copy_as_soon(rnd, choices)
            claim = await self._first_claim(rnd, choices, holder_id, state)
            if claim is not None:
                why = ("a warm or loading copy had room" if claim.option.kind in
                       _REUSED else
                       "another copy is ready as soon as the one loading, for the company")
                return self._placed(rnd, claim, priced or [claim.option], why)
        loading = options.loading_queue(rnd, models)
        if not explain:
            priced = options.comparison(rnd, models, explain=False)
        if loading is not None and not options.second_copy_pays(rnd.cost, loading, priced):
            # Step 3 without a free slot: wait for the copy that is already coming
            # rather than load a second model (DESIGN §5).
            return self._queued(rnd, loading, [loading, *(o for o in priced if o != loading)],
                                why="converging on the copy another call is loading")
        if not priced:
            fleet, cost = rnd.judged()
            refusal = classify(
                fleet, cost, preferred=models[0], acceptable=models,
                prompt_tokens=rnd.prompt_tokens,
            )
            return self._unplaced(rnd, models, priced, refusal)
        best = priced[0]
        if best.kind is _QUEUE:
            return self._queued(rnd, best, priced)
        claim = await self.claims.claim(rnd, best, holder_id, state=state)
        if claim is None:
            return None  # the state moved under us: decide again on fresh state
        return self._placed(rnd, claim, priced, f"cheapest option: {best.kind.value}")

    async def _first_claim(
        self, rnd: Round, choices: list[Option], holder_id: str, state: TicketState
    ) -> Claim | None:
        """The first of ``choices`` (cheapest first) that can still be claimed."""
        for option in choices:
            claim = await self.claims.claim(rnd, option, holder_id, state=state)
            if claim is not None:
                return claim
        return None

    async def take_queue(
        self, placement: CallPlacement, holder_id: str, *, prompt_tokens: int | None
    ) -> CallPlacement:
        """Hold a ticket on the copy a *queue* decision named, as a call in its line.

        Sharing a copy spends no memory; the ticket makes the copy count as busy (never
        an eviction victim) while the call waits there. Returns ``placement`` unchanged
        when the copy (or its provider) went away meanwhile, or a half-open circuit's one
        trial is taken.
        """
        option = placement.options[0] if placement.options else None
        if option is None:
            return placement
        rnd = await self.new_round(prompt_tokens)
        if rnd.fleet.provider(option.provider) is None:
            return placement  # its provider left the fleet meanwhile
        claim = await self.claims.claim(rnd, option, holder_id, state=TicketState.RUNNING)
        if claim is None:
            return placement
        claimed = replace(placement, ticket=claim.ticket, endpoint=claim.endpoint,
                          context_length=claim.context_length)
        if not await self.admit(claimed):
            return placement
        return claimed

    async def hold_copy(
        self, provider: str, model: str, holder_id: str, *, prompt_tokens: int | None
    ) -> Ticket | None:
        """Hold a zero-footprint ticket on the loaded copy of ``model`` on ``provider``,
        for a call sent there without a placement (a no-wait call's static fallback).

        While the ticket is held the copy counts as busy, so no plan unloads it before
        the call reaches the engine (which would load it again and evict on its own).
        ``None`` when the copy is not loaded there, is planned for unloading, or its
        context cannot hold the prompt: the check runs inside the ticket's CAS.
        """
        rnd = await self.new_round(prompt_tokens)
        p = rnd.fleet.provider(provider)
        if p is None or not p.is_resident(model):
            return None
        claim = await self.claims.claim(rnd, rnd.copy_option(p, model), holder_id,
                                        state=TicketState.RUNNING)
        return None if claim is None else claim.ticket

    def _placed(
        self, rnd: Round, claim: Claim, priced: list[Option], why: str
    ) -> CallPlacement:
        option = claim.option
        options = tuple(priced)
        return CallPlacement(
            _ACTION_OF[option.kind],
            provider=option.provider,
            endpoint=claim.endpoint,
            model=option.model,
            ticket=claim.ticket,
            evicted=claim.evicted,
            options=options,
            # the gates as they stand now; the record, and any gates still to work out,
            # when first read
            explanation=_PlacedRecord(option, options, dict(rnd.gathered), why),
            context_length=claim.context_length,
        )

    def _queued(
        self, rnd: Round, best: Option, priced: list[Option],
        why: str = "the cheapest option",
    ) -> CallPlacement:
        p = rnd.fleet.provider(best.provider)
        record = build_record(
            subject=f"call:{best.model}", gates=rnd.gates, options=priced, chosen=best,
            outcome=Outcome.DEFER,
            reason=f"queueing for a slot on {best.provider} ({best.seconds:.3f} s) is {why}; "
            "the call waits for the next capacity change and places again",
        )
        return CallPlacement(
            Action.QUEUE,
            provider=best.provider,
            endpoint=p.state.endpoint if p is not None else None,
            model=best.model,
            options=tuple(priced),
            explanation=record,
            context_length=p.context_for(best.model) if p is not None else None,
        )

    def _unplaced(
        self, rnd: Round, models: list[str], priced: list[Option], refusal: Refusal
    ) -> CallPlacement:
        action = Action.REFUSE if refusal.final else Action.WAIT
        outcome = Outcome.UNSCHEDULABLE if refusal.final else Outcome.DEFER
        record = build_record(
            subject=f"call:{models[0]}", gates=rnd.gates, options=priced, chosen=None,
            outcome=outcome, reason=_REASON_TEXT[refusal.reason].format(model=models[0]),
        )
        return CallPlacement(action, refusal=refusal, options=tuple(priced),
                             explanation=record)

    async def admit(self, placement: CallPlacement) -> bool:
        """Commit a claimed placement to its provider's circuit; a half-open circuit
        admits one trial call, so a second claim there is given back (False)."""
        circuits = self.view.circuits
        if circuits is None or placement.ticket is None or placement.provider is None:
            return True
        if circuits.admit(placement.provider):
            return True
        await self.release(placement)
        return False

    # -- after the call --------------------------------------------------------------

    async def finish(
        self, placement: CallPlacement, *, seconds: float | None = None, ok: bool | None = True
    ) -> None:
        """Release the call's ticket and learn from it (latency EMA, circuit breaker).

        ``ok`` is the call's verdict on the provider: ``False`` only for a provider
        fault, ``None`` when the call says nothing about it (cancelled, or stopped
        before the engine was asked).
        """
        view = self.view
        if placement.provider is not None:
            circuits = view.circuits
            if circuits is not None:
                if ok is None:
                    circuits.record_no_verdict(placement.provider)
                elif ok:
                    circuits.record_success(placement.provider)
                else:
                    circuits.record_failure(placement.provider)
            if ok and seconds is not None and placement.endpoint is not None:
                view.observe_latency(placement.provider, placement.endpoint, seconds)
        await self.release(placement)

    def lease(
        self, placement: CallPlacement
    ) -> contextlib.AbstractAsyncContextManager[Lease | None]:
        """``async with planner.lease(placement):`` keeps the call's ticket alive.

        The ticket is renewed every TTL/3 on the injected clock until the block ends,
        so a call longer than the TTL keeps its memory and its model never looks idle.
        A placement without a ticket (static, refused) gets a lease that does nothing.
        """
        if placement.ticket is None or placement.provider is None:
            return contextlib.nullcontext(None)
        return self.tickets.lease(placement.provider, placement.ticket.ticket_id)

    async def release(self, placement: CallPlacement) -> None:
        """Give the call's ticket back (idempotent). On NATS this may return once the
        release is sent: this process's next operation on the provider queues behind
        it, and a release the store refuses then is retried by the ticket manager."""
        if placement.ticket is None or placement.provider is None:
            return
        provider, ticket_id = placement.provider, placement.ticket.ticket_id
        # On NATS an idle lane sends the release and returns: nothing of the call waits
        # for the acknowledgement (TicketManager.release_sent); the view is told then.
        if self.tickets.release_sent(provider, ticket_id,
                                     lambda error: self._released(provider, ticket_id, error)):
            return
        try:
            await self.tickets.release(provider, ticket_id)
        except BaseException:
            self.view.invalidate(provider)
            raise
        self.view.note_released(provider, ticket_id)

    def _released(self, provider: str, ticket_id: str, error: BaseException | None) -> None:
        """A sent release's outcome: the view drops the ticket, or reads the provider
        again after a release that failed for good (the TTL reclaims its ticket)."""
        if error is None:
            self.view.note_released(provider, ticket_id)
        else:
            self.view.invalidate(provider)


_REASON_TEXT = {
    Reason.GPU_BUSY: "no provider has room for {model} now; the call waits for capacity",
    Reason.MODEL_TOO_LARGE: "no provider's usable VRAM can hold {model}",
    Reason.PROMPT_TOO_LARGE: "the prompt is longer than the context of every provider "
    "that could run an acceptable model",
    Reason.MODEL_UNKNOWN: "no provider lists {model} and no Model resource declares it "
    "(is the name misspelt?)",
    Reason.PROVIDER_DOWN: "no ready provider has {model}, and some providers do not answer",
    Reason.STATE_STALE: "the providers that might run {model} have states too old to "
    "place on; the call waits for a fresh probe",
    Reason.MEMORY_UNKNOWN: "only providers whose VRAM total is unknown could load {model}; "
    "give their vramMiB",
}
