"""Workload generation: crews issuing discussions, as a seeded, replayable trace.

Each crew instance opens discussions as a Poisson process. A discussion selects some of
the crew's agents; each selected agent runs the crew's phases in order, and each phase
is ``steps`` steps in sequence. A step is one call, or with the phase's fan-out
probability a burst of ``width`` calls issued together (parallel tool calls). Call
durations are lognormal with the phase's mean and coefficient of variation.

The trace fixes *what* is asked and how long each call computes; *when* a later step is
issued depends on how fast the policy served the previous one (an agent waits for its
answer), so only each turn's first step has a fixed issue time: the discussion's start.
Every random draw comes from a generator seeded by (seed, crew instance), so the trace
is identical across policies and runs.

A discussion *selects* its agents when it arrives, before any of them calls. The trace
records each selection (:class:`Selection`): the agent, the thread, its mulling
candidates and its calls, so a policy that plans at selection (the spec's
``commitToThread``: publish intents, hold a plan for the first mulling call, start its
load while triage runs) can do so; the others ignore it. An agent's *mulling* phase is
its first phase not named ``triage`` (the triage path places only its bound model and
is not planned ahead).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kubemoot.emulation.prompt import Prompt
from kubemoot.runtime.placement import CandidateModel
from kubemoot.sim.scenario import CrewSpec, LatencySpec, Scenario

__all__ = ["TRIAGE", "CallSpec", "Discussion", "Selection", "Step", "Trace", "Turn", "build_trace"]

#: The phase name of the triage path: never planned at selection.
TRIAGE = "triage"


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One inference call: what it asks for and how long it computes once started."""

    call_id: int
    discussion_id: int
    agent: str
    phase: str
    candidates: tuple[CandidateModel, ...]  # preferred first
    duration: float
    prompt_tokens: int
    #: the prompt as blocks, for the engine's prefix cache (None: a prompt of
    #: ``prompt_tokens`` that shares nothing with any other)
    prompt: Prompt | None = None

    @property
    def model(self) -> str:
        """The preferred model."""
        return self.candidates[0].model


@dataclass(frozen=True, slots=True)
class Step:
    calls: tuple[CallSpec, ...]  # more than one: a fan-out burst issued together
    think_seconds: float  # gap before this step is issued


@dataclass(frozen=True, slots=True)
class Turn:
    """One agent's part in one discussion: its steps, in order."""

    agent: str
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Discussion:
    discussion_id: int
    crew: str
    arrival: float  # seconds after the simulation starts
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Selection:
    """An agent selected for a thread at ``at``, before its first call.

    ``candidates`` are its mulling phase's (preferred first); ``first_call`` is the id
    of that phase's first call, the one a plan held from selection is for; ``calls``
    are the ids of every call the agent makes in the thread (its intents last until
    they have all ended).
    """

    at: float
    thread: str
    agent: str
    candidates: tuple[CandidateModel, ...]
    first_call: int
    calls: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Trace:
    discussions: tuple[Discussion, ...]  # by arrival
    call_count: int
    selections: tuple[Selection, ...] = ()  # by time

    def calls(self) -> list[CallSpec]:
        return [c for d in self.discussions for t in d.turns for s in t.steps for c in s.calls]


def _lognormal(rng: random.Random, latency: LatencySpec) -> float:
    if latency.cv == 0:
        return latency.mean_seconds
    sigma2 = math.log1p(latency.cv**2)
    mu = math.log(latency.mean_seconds) - sigma2 / 2
    return rng.lognormvariate(mu, math.sqrt(sigma2))


def _crew_discussions(
    crew: CrewSpec, instance: str, duration: float, rng: random.Random
) -> list[tuple[float, list[str], list[list[tuple[str, list[float], list[int], float]]]]]:
    """Arrivals and, per selected agent, per step: (phase, durations, prompt sizes, think)."""
    rate = crew.discussions_per_hour / 3600.0
    agents = [f"{instance}/agent-{k:02d}" for k in range(crew.agents)]
    out: list[tuple[float, list[str], list[list[tuple[str, list[float], list[int], float]]]]] = []
    t = rng.expovariate(rate)
    while t < duration:
        chosen = rng.sample(agents, crew.agents_per_discussion)
        turns: list[list[tuple[str, list[float], list[int], float]]] = []
        for _agent in chosen:
            steps: list[tuple[str, list[float], list[int], float]] = []
            for phase in crew.phases:
                for _ in range(phase.steps):
                    burst = phase.fan_out.width if rng.random() < phase.fan_out.probability else 1
                    durations = [_lognormal(rng, phase.latency) for _ in range(burst)]
                    steps.append(
                        (phase.name, durations, [phase.prompt_tokens] * burst, phase.think_seconds)
                    )
            turns.append(steps)
        out.append((t, chosen, turns))
        t += rng.expovariate(rate)
    return out


def build_trace(scenario: Scenario, *, seed: int | None = None) -> Trace:
    """The scenario's workload as a trace; the same (scenario, seed) gives the same trace."""
    spec = scenario.spec
    base_seed = spec.seed if seed is None else seed
    raw: list[tuple[float, str, list[str], list[list[tuple[str, list[float], list[int], float]]],
                    CrewSpec]] = []
    for crew in spec.crews:
        for i in range(crew.count):
            instance = crew.name if crew.count == 1 else f"{crew.name}-{i:03d}"
            rng = random.Random(f"{base_seed}:{instance}")
            for arrival, chosen, turns in _crew_discussions(
                crew, instance, spec.duration_seconds, rng
            ):
                raw.append((arrival, instance, chosen, turns, crew))
    raw.sort(key=lambda r: (r[0], r[1]))
    discussions: list[Discussion] = []
    selections: list[Selection] = []
    call_id = 0
    for d_id, (arrival, instance, chosen, turns, crew) in enumerate(raw):
        phases = {p.name: p for p in crew.phases}
        built_turns: list[Turn] = []
        for agent, steps in zip(chosen, turns, strict=True):
            built_steps: list[Step] = []
            history: list[int] = []  # the tokens of each earlier step of this thread
            for phase_name, durations, prompts, think in steps:
                phase = phases[phase_name]
                cands = tuple(CandidateModel(c.model, c.score) for c in phase.candidates)
                thread = (Prompt.thread(f"{d_id}/{agent}", history, system=phase.prompt_tokens)
                          if phase.thread_tokens else None)
                calls: list[CallSpec] = []
                for duration, prompt in zip(durations, prompts, strict=True):
                    calls.append(CallSpec(
                        call_id, d_id, agent, phase_name, cands, duration,
                        thread.tokens if thread is not None else prompt, thread,
                    ))
                    call_id += 1
                if phase.thread_tokens:
                    history.append(phase.thread_tokens)
                built_steps.append(Step(tuple(calls), think))
            turn = Turn(agent, tuple(built_steps))
            built_turns.append(turn)
            selection = _selection(turn, arrival, str(d_id))
            if selection is not None:
                selections.append(selection)
        discussions.append(Discussion(d_id, instance, arrival, tuple(built_turns)))
    return Trace(tuple(discussions), call_id, tuple(selections))


def _selection(turn: Turn, at: float, thread: str) -> Selection | None:
    """The turn's selection, or None when it has no mulling phase (triage only)."""
    calls = [c for s in turn.steps for c in s.calls]
    first = next((c for c in calls if c.phase != TRIAGE), None)
    if first is None:
        return None
    return Selection(at, thread, turn.agent, first.candidates, first.call_id,
                     tuple(c.call_id for c in calls))
