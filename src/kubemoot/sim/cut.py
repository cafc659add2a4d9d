"""Small traces cut from a scenario, for the offline optimum (:mod:`kubemoot.sim.optimum`).

A cut keeps a few cards, the few models asked for most, and the first calls for them,
small enough for an exact solver. Its calls are *open-loop*: each is issued at the time
it would be issued if no call of its turn had ever waited (the discussion's arrival
plus the durations and think times before it), so the trace no longer depends on the
policy and every policy and the solver see the very same release times. The cut is
also a scenario and a :class:`~kubemoot.sim.workload.Trace` (one single-call discussion
per call), so the simulator runs every policy on it unchanged.

Each call also keeps when its agent was *selected* (its discussion's arrival, never
before the cut's start, when the cards are empty), and the cut's trace keeps the
selections whose first mulling call is in the cut, with that call's agent, so a policy
that plans at selection does so on the cut as it would on the scenario. The offline
optimum may be asked to load nothing before a call's agent was selected
(:func:`kubemoot.sim.optimum.solve`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import DEFAULTS
from kubemoot.sim.scenario import Scenario, ScenarioProvider
from kubemoot.sim.workload import CallSpec, Discussion, Selection, Step, Trace, Turn

__all__ = ["Cut", "CutCall", "CutCard", "cut_trace"]

#: Long enough that no call of a cut stands aside: a lost call has no wait to compare.
CUT_WAIT_LIMIT_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class CutCard:
    """One card of a cut: what the engine rules need to know about it."""

    name: str
    usable_mib: int
    slots: int
    load_rate_mibps: float
    unload_seconds: float


@dataclass(frozen=True, slots=True)
class CutCall:
    """One call: issued at ``release``, computes ``duration``, on any of ``models``;
    its agent was selected at ``selected`` (``None``: when it was issued)."""

    call_id: int
    release: float
    duration: float
    models: tuple[str, ...]  # the preferred model first, then the in-band candidates
    selected: float | None = None

    @property
    def selected_at(self) -> float:
        return self.release if self.selected is None else min(self.selected, self.release)


@dataclass(frozen=True, slots=True)
class Cut:
    """A small trace: cards, model sizes and calls, and (from :func:`cut_trace`) the
    scenario and trace that let the simulator run policies on it."""

    name: str
    cards: tuple[CutCard, ...]
    sizes: dict[str, int]
    calls: tuple[CutCall, ...]
    scenario: Scenario | None = None
    trace: Trace | None = None


def _release_times(trace: Trace) -> list[tuple[float, float, CallSpec]]:
    """Each call with the time it is issued when nothing waits (see the module
    docstring) and its discussion's arrival (when its agent was selected)."""
    out: list[tuple[float, float, CallSpec]] = []
    for discussion in trace.discussions:
        for turn in discussion.turns:
            at = discussion.arrival
            for step in turn.steps:
                at += step.think_seconds
                out.extend((at, discussion.arrival, call) for call in step.calls)
                at += max(call.duration for call in step.calls)
    return sorted(out, key=lambda r: (r[0], r[2].call_id))


def _cards(scenario: Scenario, count: int) -> list[ScenarioProvider]:
    """``count`` cards, one from each provider group in turn (a mix of card kinds)."""
    groups = [[g] * g.count for g in scenario.spec.providers]
    taken: Counter[str] = Counter()
    picked: list[ScenarioProvider] = []
    while len(picked) < count and any(groups):
        for group in groups:
            if group and len(picked) < count:
                spec = group.pop()
                name = spec.name if spec.count == 1 else f"{spec.name}-{taken[spec.name]}"
                taken[spec.name] += 1
                picked.append(spec.model_copy(update={"name": name, "count": 1}))
    return picked


def cut_trace(
    scenario: Scenario,
    trace: Trace,
    *,
    cards: int = 3,
    models: int = 4,
    calls: int = 60,
    tolerance: float = DEFAULTS.candidate_tolerance,
) -> Cut:
    """The first ``calls`` calls for the ``models`` most-asked models, on ``cards`` cards.

    A model is kept only when one of the chosen cards can hold it. A call's candidates
    are cut to the kept models within ``tolerance`` points of its preferred one (the
    band the runtime may use); calls whose preferred model is not kept are left out.
    """
    spec = scenario.spec
    chosen_cards = _cards(scenario, cards)
    largest = max(c.vram_mib - c.reserve_mib for c in chosen_cards)
    sizes = {m.name: m.vram_mib for m in spec.models if m.vram_mib <= largest}
    timed = _release_times(trace)
    asked = Counter(call.model for _t, _s, call in timed if call.model in sizes)
    kept = {m for m, _n in asked.most_common(models)}
    rate = spec.settings.load_rate_mibps
    out_calls: list[CutCall] = []
    specs: list[CallSpec] = []
    cut_of: dict[int, int] = {}  # the scenario trace's call id → the cut's
    for release, selected, call in timed:
        if len(out_calls) >= calls:
            break
        if call.model not in kept:
            continue
        top = call.candidates[0].score
        band = tuple(c for c in call.candidates
                     if c.model in kept and c.score >= top - tolerance)
        cut_id = len(out_calls)
        cut_of[call.call_id] = cut_id
        out_calls.append(CutCall(cut_id, release, call.duration, tuple(c.model for c in band),
                                 selected))
        specs.append(CallSpec(cut_id, cut_id, f"{call.agent}#{cut_id}", call.phase,
                              tuple(CandidateModel(c.model, c.score) for c in band),
                              call.duration, call.prompt_tokens))
    start = out_calls[0].release if out_calls else 0.0
    # Before the cut's start its cards are empty and nothing was selected yet.
    out_calls = [CutCall(c.call_id, c.release - start, c.duration, c.models,
                         max(0.0, c.selected_at - start))
                 for c in out_calls]
    selections = _selections(trace, cut_of, out_calls, specs)
    discussions = tuple(
        Discussion(s.call_id, "cut", c.release, (Turn(s.agent, (Step((s,), 0.0),)),))
        for s, c in zip(specs, out_calls, strict=True)
    )
    sub = scenario.model_copy(update={
        "spec": spec.model_copy(update={
            "providers": chosen_cards,
            "models": [m for m in spec.models if m.name in kept],
            "settings": spec.settings.model_copy(
                update={"gpu_wait_limit_seconds": CUT_WAIT_LIMIT_SECONDS}),
        }),
    })
    card_rules = tuple(
        CutCard(c.name, c.vram_mib - c.reserve_mib, c.max_parallel,
                c.load_rate_mibps or rate,
                spec.settings.unload_seconds if c.unload_seconds is None else c.unload_seconds)
        for c in chosen_cards
    )
    return Cut(f"{scenario.name}-cut", card_rules, {m: sizes[m] for m in sorted(kept)},
               tuple(out_calls), sub, Trace(discussions, len(specs), selections))


def _selections(
    trace: Trace, cut_of: dict[int, int], calls: list[CutCall], specs: list[CallSpec]
) -> tuple[Selection, ...]:
    """The scenario's selections whose first mulling call is in the cut, in cut terms:
    that call's agent and band, the turn's calls that are in the cut."""
    out: list[Selection] = []
    for s in trace.selections:
        first = cut_of.get(s.first_call)
        if first is None:
            continue
        mine = tuple(cut_of[c] for c in s.calls if c in cut_of)
        out.append(Selection(calls[first].selected_at, s.thread, specs[first].agent,
                             specs[first].candidates, first, mine))
    return tuple(sorted(out, key=lambda s: (s.at, s.first_call)))
