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
``max(0, min over its candidates m of t1(m) + L(m) − r)``. That needs the true issue
time ``r``, which the trace fixes only for the first step of each turn (it is issued at
the discussion's arrival plus its think gap); for every later step we use the trivial
bound 0. Summing these per-call bounds and dividing by the number of calls whose
preferred model fits some card gives a bound on the mean wait of any of the policies.

The bound is deliberately simple: it ignores slot contention and memory pressure, so
it is loose on busy fleets; a policy's ratio to it overstates how far it is from the
best possible.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubemoot.sim.scenario import Scenario
from kubemoot.sim.workload import Trace

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
    fixed: list[tuple[float, tuple[str, ...], str]] = []  # (issue time, candidates, preferred)
    others: list[str] = []  # preferred models of the later steps (bound 0)
    for discussion in trace.discussions:
        for turn in discussion.turns:
            t = discussion.arrival
            for index, step in enumerate(turn.steps):
                t += step.think_seconds
                for call in step.calls:
                    earliest[call.model] = min(earliest.get(call.model, t), t)
                    if index == 0:
                        fixed.append((t, tuple(c.model for c in call.candidates), call.model))
                    else:
                        others.append(call.model)
                t += max(c.duration for c in step.calls)
    ready = {m: earliest[m] + load[m] for m in earliest if m in load}
    total = 0.0
    counted = sum(1 for m in others if m in load)
    for issued, candidates, preferred in fixed:
        if preferred not in load:
            continue  # refused by every policy: no wait to bound
        counted += 1
        soonest = min(ready.get(m, float("inf")) for m in candidates)
        total += max(0.0, soonest - issued)
    mean = total / counted if counted else 0.0
    return LowerBound(mean_wait=mean, calls=counted, first_ready=dict(sorted(ready.items())))
