"""A lower bound on the mean per-call wait of a trace, valid for every policy compared.

The full argument is in docs/simulator.md ("The lower bound on mean wait"); this is
its outline. A call's wait is issue → start of inference; its computing time is fixed
by the trace and the same on every card. Only a turn's first step has an issue time the
trace fixes: each later step is issued ``think`` seconds after the previous step's last
call ends, so a policy that delays one step also shifts the rest of the turn. Every
figure below is therefore taken against the *unhindered* timetable (no call ever
waits), which no policy can change.

Three facts hold in every run of every compared policy in which all calls finish:

* **Capacity.** A call runs in a slot of a resident copy of one of its candidate
  models. A card holds at most one copy of a model, each with ``maxParallel`` slots,
  and its resident copies fit in its usable memory; so the calls whose models lie in a
  set ``S`` never run more than ``slots(S)`` at once (per card: slots × the largest
  number of models of ``S`` that fit together).
* **First loads.** Cards start empty and the policies load a model only for a call that
  prefers it, and no earlier than its agent's selection, so no copy of ``m`` exists
  before ``ready(m)``: the earliest selection of an agent whose mulling call prefers
  ``m`` (a triage call's issue, for a triage model) plus its shortest load time.
* **Turns.** A turn's waits add up to at least its delay: (its end) − (its unhindered
  end); and within a step, all waits but the largest add up to at least what the
  step's other calls must queue among themselves on ``slots`` servers (shortest first).

From them, for any set ``X`` of turns (a bound on ``X``'s own waits; other turns only
take capacity away):

* (first load) per turn, the larger of the first step's waits for a first copy and the
  delay a first copy forces on the turn's end;
* (bursts) per step, the queueing among a burst's own calls;
* (mean busy time) the turn's end is at least its work-weighted mean busy time plus a
  fixed tail. Relaxing each capacity group to one machine of speed ``slots`` and the
  calls to pre-emptible work released at their unhindered issue time (or ``ready``),
  the smallest sum of mean busy times is what serving the turn with the least total
  work first gives, so the turns' delays add up to at least that minimum − their
  unhindered ends + tails. Clamped at 0, plus the bursts' extra.

Any partition of the turns into such sets gives a valid total; a dynamic program over
runs of turns (by first issue) picks a good one. Dividing by the calls counted gives
the bound on the mean.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kubemoot.settings import DEFAULTS
from kubemoot.sim.scenario import Scenario
from kubemoot.sim.workload import TRIAGE, CallSpec, Trace, Turn

__all__ = ["LowerBound", "lower_bound", "pooled_busy_time", "spt_total_wait"]

#: The most turns one set of the partition spans. Larger finds tighter totals on busy
#: traces at quadratic cost; it never affects validity.
SEGMENT_TURNS = 10
#: The runtime's default candidate tolerance: the simulator runs it with defaults.
DEFAULT_TOLERANCE = DEFAULTS.candidate_tolerance
#: Above this many turns the segments shrink so the bound stays a fraction of a run.
SEGMENT_BUDGET = 40_000


@dataclass(frozen=True, slots=True)
class LowerBound:
    mean_wait: float
    calls: int  # calls counted: those some policy can serve in a complete run
    first_ready: dict[str, float]  # model → earliest moment a copy can be ready
    first_load_mean: float = 0.0  # the first-load argument alone, for comparison


@dataclass(frozen=True, slots=True)
class _Work:
    release: float  # unhindered issue time, or the first moment a copy can be ready
    seconds: float
    fine: int  # capacity group: calls with the same candidate models
    coarse: int  # capacity group: candidate models linked through shared models
    after: float  # least time from this call's mean busy moment to the turn's end


@dataclass(frozen=True, slots=True)
class _TurnFacts:
    start: float  # first issue time, fixed by the trace
    work: tuple[_Work, ...]
    total: float  # seconds of computing in the turn
    end: float  # the unhindered end
    first_load: float  # per-turn first-load bound
    chain: float  # delay a first copy forces on the turn's end
    bursts: float  # every step's own queueing, plus the first step's wait for a copy
    extra: float  # per step, the queueing of all but the longest-waiting call
    counted: int


def spt_total_wait(durations: Iterable[float], servers: int) -> float:
    """Least total wait of jobs released together on ``servers`` identical machines.

    Shortest first is optimal for the total completion time on identical machines
    (and waits are completions minus the fixed work), so this is a lower bound on the
    total wait of any schedule of these jobs.
    """
    jobs = sorted(durations)
    if servers <= 0:
        raise ValueError("servers must be positive")
    if len(jobs) <= servers:
        return 0.0
    free = [0.0] * servers
    total = 0.0
    for seconds in jobs:
        start = heapq.heappop(free)
        total += start
        heapq.heappush(free, start + seconds)
    return total


def pooled_busy_time(jobs: Sequence[tuple[float, float, float]], speed: float) -> float:
    """Least ``Σ weight·∫ t·rate(t) dt`` over pre-emptive schedules on one machine.

    ``jobs`` are ``(release, work, weight)``; the machine does ``speed`` units of work
    per second. Serving the released work of highest weight first is optimal: if lower
    weight work ran at ``t1`` while higher weight work available then ran at ``t2 > t1``,
    swapping a sliver of the two lowers the sum, and with no per-job rate limit the
    swap is always possible.
    """
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
    waiting: list[tuple[float, int, float]] = []  # (−weight, index, work left)
    t = 0.0
    total = 0.0
    nxt = 0
    while nxt < len(order) or waiting:
        if not waiting:
            t = max(t, jobs[order[nxt]][0])
        while nxt < len(order) and jobs[order[nxt]][0] <= t:
            i = order[nxt]
            heapq.heappush(waiting, (-jobs[i][2], i, jobs[i][1]))
            nxt += 1
        neg_weight, i, left = heapq.heappop(waiting)
        horizon = jobs[order[nxt]][0] if nxt < len(order) else float("inf")
        end = min(t + left / speed, horizon)
        total += -neg_weight * speed * (end - t) * (end + t) / 2
        if end < t + left / speed:
            heapq.heappush(waiting, (neg_weight, i, left - (end - t) * speed))
        t = end
    return total


class _Fleet:
    """How many calls of a set of models the fleet can run at once, at most."""

    def __init__(self, scenario: Scenario) -> None:
        spec = scenario.spec
        self._sizes = {m.name: m.vram_mib for m in spec.models}
        self._cards = [(p.vram_mib - p.reserve_mib, p.max_parallel, p.count)
                       for p in spec.providers]
        self._slots: dict[frozenset[str], int] = {}

    def slots(self, models: frozenset[str]) -> int:
        found = self._slots.get(models)
        if found is None:
            found = 0
            for usable, parallel, count in self._cards:
                # The most models of the set that fit together: smallest first.
                used = held = 0
                for size in sorted(self._sizes[m] for m in models):
                    if used + size > usable:
                        break
                    used += size
                    held += 1
                found += count * parallel * held
            self._slots[models] = found
        return found


def _first_ready(scenario: Scenario, trace: Trace) -> dict[str, float]:
    """model → earliest moment a copy can be ready (demand-driven loading)."""
    spec = scenario.spec
    load: dict[str, float] = {}
    for model in spec.models:
        rates = [p.load_rate_mibps or spec.settings.load_rate_mibps
                 for p in spec.providers if p.vram_mib - p.reserve_mib >= model.vram_mib]
        if rates:
            load[model.name] = model.vram_mib / max(rates)
    earliest: dict[str, float] = {}
    for discussion in trace.discussions:
        for turn in discussion.turns:
            t = discussion.arrival
            for step in turn.steps:
                t += step.think_seconds
                for call in step.calls:
                    # A selected agent's mulling model may start loading at selection
                    # (the discussion's arrival), before the call is issued.
                    at = t if call.phase == TRIAGE else discussion.arrival
                    earliest[call.model] = min(earliest.get(call.model, at), at)
                t += max(c.duration for c in step.calls)
    return dict(sorted((m, earliest[m] + load[m]) for m in earliest if m in load))


def _usable(call: CallSpec, tolerance: float) -> tuple[str, ...]:
    """Models any compared policy may run the call on: the preferred model (the
    baselines' only choice) and candidates within the runtime's tolerance of it (the
    only others the runtime takes). A policy never runs a call on anything else."""
    floor = call.candidates[0].score - tolerance
    return tuple(c.model for c in call.candidates if c is call.candidates[0] or c.score >= floor)


def _soonest(call: CallSpec, ready: dict[str, float], tolerance: float) -> float:
    return min(ready.get(m, float("inf")) for m in _usable(call, tolerance))


class _Groups:
    """Capacity groups: per candidate set, and per component of linked model sets."""

    def __init__(
        self, trace: Trace, ready: dict[str, float], fleet: _Fleet, tolerance: float
    ) -> None:
        self.fleet = fleet
        self.ready = ready
        self.tolerance = tolerance
        parent: dict[str, str] = {}

        def find(m: str) -> str:
            while parent.setdefault(m, m) != m:
                m = parent[m]
            return m

        sets = {self.models(c) for c in trace.calls()}
        for models in sets:
            roots = [find(m) for m in models]
            for root in roots[1:]:
                parent[root] = roots[0]
        components: dict[str, set[str]] = {}
        for m in parent:
            components.setdefault(find(m), set()).add(m)
        self._component = {m: frozenset(components[find(m)]) for m in parent}
        self._ids: dict[frozenset[str], int] = {}
        self.speeds: list[int] = []

    def models(self, call: CallSpec) -> frozenset[str]:
        """The models a call can run on: usable candidates some call prefers (a model no
        call prefers is never loaded)."""
        return frozenset(m for m in _usable(call, self.tolerance) if m in self.ready)

    def ids(self, models: frozenset[str]) -> tuple[int, int]:
        return self._id(models), self._id(self._component[next(iter(models))])

    def _id(self, models: frozenset[str]) -> int:
        found = self._ids.get(models)
        if found is None:
            found = self._ids[models] = len(self.speeds)
            self.speeds.append(self.fleet.slots(models))
        return found


def _turn_facts(turn: Turn, arrival: float, groups: _Groups) -> _TurnFacts | None:
    ready = groups.ready
    steps = []
    for step in turn.steps:  # a call no policy can serve ends the turn for every policy
        if any(_soonest(c, ready, groups.tolerance) == float("inf") for c in step.calls):
            break
        steps.append(step)
    if not steps:
        return None
    issue: list[float] = []
    t = arrival
    for step in steps:
        t += step.think_seconds
        issue.append(t)
        t += max(c.duration for c in step.calls)
    end = t  # the unhindered end
    tails: list[float] = []
    tail = 0.0
    for step in reversed(steps):
        tails.append(tail)
        tail += step.think_seconds + max(c.duration for c in step.calls)
    tails.reverse()
    work: list[_Work] = []
    total = sum(c.duration for s in steps for c in s.calls)
    chain_end = end
    bursts = extra = 0.0
    for step, r, tail in zip(steps, issue, tails, strict=True):
        servers = groups.fleet.slots(frozenset().union(*(groups.models(c) for c in step.calls)))
        durations = [c.duration for c in step.calls]
        bursts += spt_total_wait(durations, servers)
        extra += spt_total_wait(sorted(durations)[:-1], servers)
        for call in step.calls:
            soonest = _soonest(call, ready, groups.tolerance)
            fine, coarse = groups.ids(groups.models(call))
            work.append(_Work(max(r, soonest), call.duration, fine, coarse,
                              call.duration / 2 + tail))
            chain_end = max(chain_end, soonest + call.duration + tail)
    waits = [max(0.0, _soonest(c, ready, groups.tolerance) - issue[0]) for c in steps[0].calls]
    # The first step's calls all wait for a copy, then queue among themselves.
    bursts += len(waits) * min(waits)
    first_wait = sum(waits)
    chain = chain_end - end
    return _TurnFacts(
        start=issue[0], work=tuple(work), total=total, end=end,
        first_load=max(first_wait, chain), chain=chain, bursts=bursts, extra=extra,
        counted=sum(len(s.calls) for s in steps),
    )


def _delay_bound(turns: Sequence[_TurnFacts], speeds: Sequence[int]) -> float:
    """A lower bound on the turns' total delay (mean-busy-time argument); may be < 0."""
    best = -float("inf")
    for coarse in (False, True):
        per_group: dict[int, list[tuple[float, float, float]]] = {}
        fixed = 0.0
        for turn in turns:
            if turn.total <= 0:
                continue  # no work, no weight: leaving a turn out keeps the sum a bound
            fixed -= turn.end
            for w in turn.work:
                # E ≥ Σ share·(mean busy moment + after), shares = each call's part of the work.
                fixed += w.seconds / turn.total * w.after
                group = w.coarse if coarse else w.fine
                per_group.setdefault(group, []).append((w.release, w.seconds, 1 / turn.total))
        busy = sum(pooled_busy_time(jobs, speeds[g]) for g, jobs in per_group.items())
        best = max(best, busy + fixed)
    return best


def _segment(turns: Sequence[_TurnFacts], speeds: Sequence[int]) -> float:
    """A lower bound on the total wait of these turns' calls."""
    queueing = max(0.0, _delay_bound(turns, speeds), sum(t.chain for t in turns))
    return max(
        sum(t.first_load for t in turns),
        sum(t.bursts for t in turns),
        queueing + sum(t.extra for t in turns),
    )


def lower_bound(
    scenario: Scenario, trace: Trace, *, tolerance: float = DEFAULT_TOLERANCE
) -> LowerBound:
    """The bound described in the module docstring and docs/simulator.md.

    ``tolerance`` must be the runtime's candidate tolerance in the compared run: the
    bound counts only the models some compared policy may use for each call.
    """
    ready = _first_ready(scenario, trace)
    groups = _Groups(trace, ready, _Fleet(scenario), tolerance)
    facts = sorted(
        (f for d in trace.discussions for turn in d.turns
         if (f := _turn_facts(turn, d.arrival, groups)) is not None),
        key=lambda f: f.start,
    )
    n = len(facts)
    span = max(1, min(SEGMENT_TURNS, SEGMENT_BUDGET // max(n, 1)))
    # best[i]: the largest valid total for the first i turns, over partitions into runs
    # of at most ``span`` consecutive turns (every partition is valid; this picks one).
    best = [0.0] * (n + 1)
    for i in range(1, n + 1):
        best[i] = max(best[k] + _segment(facts[k:i], groups.speeds)
                      for k in range(max(0, i - span), i))
    counted = sum(f.counted for f in facts)
    first_load = sum(f.first_load for f in facts)
    return LowerBound(
        mean_wait=best[n] / counted if counted else 0.0,
        calls=counted,
        first_ready=ready,
        first_load_mean=first_load / counted if counted else 0.0,
    )
