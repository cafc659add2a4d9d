"""A lower bound on the mean per-call wait of a trace, valid for every policy compared.

Derivation. All cards start empty, and every policy we compare is *demand-driven*: it
starts loading a model only for a call that prefers that model (the baselines load the
preferred model of the call they route; the kubemoot runtime cold-loads only the
preferred model and uses other candidates only when already warm or loading). Let

* ``L(m)`` be the shortest possible load time of model ``m``: its size over the fastest
  load rate among the cards whose usable memory can hold it;
* ``t1(m)`` be the earliest moment any call preferring ``m`` can be issued: the
  discussion's arrival plus, for later steps of a turn, the think gaps and the compute
  time of every earlier step (waits only delay it further).

No copy of ``m`` can exist anywhere before ``t1(m) + L(m)``. A call can only start on
one of its candidate models, so a call issued at ``r`` waits at least
``max(0, ready(c) − r)`` with ``ready(c)`` the minimum over its candidates ``m`` of
``t1(m) + L(m)``. The trace fixes ``r`` only for the first step of each turn, so per
turn (one agent's steps in one discussion) we take the larger of two bounds on the sum
of its calls' waits:

(a) the first step's calls: ``Σ max(0, ready(c) − r1)``, ``r1`` its fixed issue time;
(b) the chain: a step is issued when the previous step's last call ends, so the turn's
    waits add up to (its end) − (its end had nothing waited), and step ``k``'s end
    (hence the turn's) is at least ``ready(c) + duration(c)`` for each of its calls,
    followed by the think gaps and compute of the later steps. (For a burst, the call
    that ends last waited at least the step's share of the delay, so the sum of the
    burst's waits covers it.)

Both hold for every call sequence any of the policies can produce, so their maximum
does too. Summing over turns and dividing by the number of calls whose preferred model
fits some card gives a bound on the mean wait.

The bound is deliberately simple: it ignores slot contention and memory pressure, so
it is loose on busy fleets; a policy's ratio to it overstates how far it is from the
best possible.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubemoot.sim.scenario import Scenario
from kubemoot.sim.workload import CallSpec, Trace, Turn

__all__ = ["LowerBound", "lower_bound"]


@dataclass(frozen=True, slots=True)
class LowerBound:
    mean_wait: float
    calls: int  # calls counted: those whose preferred model fits some card
    first_ready: dict[str, float]  # model → earliest moment a copy can be ready


def _min_load_seconds(scenario: Scenario) -> dict[str, float]:
    spec = scenario.spec
    out: dict[str, float] = {}
    for model in spec.models:
        rates = [
            p.load_rate_mibps or spec.settings.load_rate_mibps
            for p in spec.providers
            if p.vram_mib - p.reserve_mib >= model.vram_mib
        ]
        if rates:
            out[model.name] = model.vram_mib / max(rates)
    return out


def lower_bound(scenario: Scenario, trace: Trace) -> LowerBound:
    """The bound described in the module docstring."""
    load = _min_load_seconds(scenario)
    earliest: dict[str, float] = {}
    for discussion in trace.discussions:
        for turn in discussion.turns:
            t = discussion.arrival
            for step in turn.steps:
                t += step.think_seconds
                for call in step.calls:
                    earliest[call.model] = min(earliest.get(call.model, t), t)
                t += max(c.duration for c in step.calls)
    ready = {m: earliest[m] + load[m] for m in earliest if m in load}
    total = 0.0
    counted = 0
    for discussion in trace.discussions:
        for turn in discussion.turns:
            total += _turn_bound(turn, discussion.arrival, ready)
            counted += sum(1 for s in turn.steps for c in s.calls if c.model in load)
    mean = total / counted if counted else 0.0
    return LowerBound(mean_wait=mean, calls=counted, first_ready=dict(sorted(ready.items())))


def _turn_bound(turn: Turn, arrival: float, ready: dict[str, float]) -> float:
    """A lower bound on the sum of the waits of one turn's calls (module docstring)."""
    steps = turn.steps
    first_issue = arrival + steps[0].think_seconds
    # (a) the first step's calls, whose issue time is fixed
    first_step = sum(
        max(0.0, _soonest(call, ready) - first_issue) for call in steps[0].calls
        if call.model in ready
    )
    # (b) the chain: the turn cannot end before any of its calls' copies exist
    unhindered_end = arrival + sum(s.think_seconds + max(c.duration for c in s.calls)
                                   for s in steps)
    latest_end = unhindered_end
    tail = 0.0  # think and compute of the steps after the one being looked at
    for step in reversed(steps):
        for call in step.calls:
            if call.model in ready:
                latest_end = max(latest_end, _soonest(call, ready) + call.duration + tail)
        tail += step.think_seconds + max(c.duration for c in step.calls)
    return max(first_step, latest_end - unhindered_end)


def _soonest(call: CallSpec, ready: dict[str, float]) -> float:
    return min(ready.get(c.model, float("inf")) for c in call.candidates)
