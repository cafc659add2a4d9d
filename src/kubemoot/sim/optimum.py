"""The offline optimum of a small trace: least total wait, knowing every call in advance.

A constraint model solved with OR-Tools CP-SAT (an optional dependency, imported only
when :func:`solve` runs: ``pip install 'kubemoot[bench]'``). The rules are the
simulator engine's, as far as they bind a schedule:

* a card holds copies of models; a copy takes its model's size in memory from the
  start of its load until its unload has finished, and the copies on a card never need
  more than the card's usable memory (total less reserve);
* a card loads one model at a time; a load takes size / load rate, an unload the
  card's unload time, and a copy of a model is on a card at most once at a time;
* a call starts no earlier than it is issued, on a copy that has finished loading, and
  runs its duration on one of the copy's slots; a copy is unloaded only after its last
  call has ended (no eviction of busy copies);
* a call may run on any model of its band (the preferred one and the in-band
  candidates the runtime may use).

Times are whole ticks of :data:`TICK_SECONDS`, rounded in the optimum's favour
(releases, durations, loads and unloads down), so what is solved is a relaxation of the
continuous problem, never harder; waits are then counted from the true issue times, so
a call may start up to a tick before it was issued and its wait is a hair below 0.
Prompt prefill is not modelled (a call's prompt costs nothing), which also only favours
the optimum. Each card may load each model at most
``loads_per_copy`` times over the trace, which bounds the model's size; a schedule that
needs more reloads than that is not considered (docs/simulator.md discusses the limit).

When the time limit ends the search before optimality is proven, the result is the
best schedule found (an upper bound on the optimum) together with the solver's proven
lower bound; :attr:`Optimum.proven` says which case it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubemoot.sim.cut import Cut

__all__ = ["TICK_SECONDS", "Hint", "Optimum", "Placed", "hints_from", "solve"]

#: The model's unit of time.
TICK_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class Placed:
    """Where and when the optimum runs one call."""

    call_id: int
    card: str
    model: str
    start: float
    wait: float
    load: int = 0  # which load of the model on the card it runs on (0: the first)


@dataclass(frozen=True, slots=True)
class Optimum:
    """The solver's answer for one cut (times in seconds)."""

    calls: int
    total_wait: float  # of the best schedule found
    bound_total_wait: float  # the solver's proven lower bound on any schedule's total
    proven: bool  # the best schedule is optimal (total_wait == bound, within a tick)
    status: str
    solve_seconds: float
    placed: tuple[Placed, ...] = field(default=())

    @property
    def mean_wait(self) -> float:
        return self.total_wait / max(self.calls, 1)

    @property
    def bound_mean_wait(self) -> float:
        return self.bound_total_wait / max(self.calls, 1)

    def hints(self) -> dict[int, Hint]:
        """This schedule as hints for another search (:func:`solve`'s ``hint``)."""
        return {p.call_id: Hint(p.card, p.model, p.start, p.load) for p in self.placed}

    def or_stricter(self, stricter: Optimum) -> Optimum:
        """The better schedule of this search and one found under a stricter rule.

        A schedule that obeys a stricter rule obeys every looser one (a load that waits
        for a call's issue also waits for its agent's selection), so when a time limit
        stopped this search above the stricter search's answer, that answer is the
        better schedule for this rule too. The proven bound stays this search's own:
        the stricter rule's bound does not hold here. So the reactive, selected and
        unrestricted optima always come out in that order.
        """
        if stricter.calls != self.calls or stricter.total_wait >= self.total_wait:
            return self
        return replace(
            self, total_wait=stricter.total_wait, placed=stricter.placed,
            # the objective counts whole ticks: within half a tick of the bound is on it
            proven=stricter.total_wait - self.bound_total_wait < TICK_SECONDS / 2,
            status=f"{self.status}, its stricter rule's schedule",
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "meanWaitSeconds": round(self.mean_wait, 3),
            "boundMeanWaitSeconds": round(self.bound_mean_wait, 3),
            "proven": self.proven,
            "status": self.status,
            "solveSeconds": round(self.solve_seconds, 2),
        }


@dataclass(frozen=True, slots=True)
class Hint:
    """A known schedule's placement of one call: where to start the search from."""

    card: str
    model: str
    start: float
    load: int  # which load of the model on the card (0: the first)


def hints_from(
    served: Mapping[int, tuple[str, str, float]],
    loads: Sequence[tuple[float, str, str, int]],
) -> dict[int, Hint]:
    """Hints from a simulated run: call id → (card, model, start), and the run's loads
    as ``(time, card, model, MiB)``. A call ran on the latest load of its model on its
    card that began before it started."""
    hints: dict[int, Hint] = {}
    for call_id, (card, model, start) in served.items():
        before = sum(1 for t, c, m, _mib in loads if c == card and m == model and t <= start)
        if before:
            hints[call_id] = Hint(card, model, start, before - 1)
    return hints


@dataclass(slots=True)
class _Copy:
    """One possible copy in the model: its solver variables and the calls it may run."""

    present: Any
    begin: Any  # its load starts
    ready: Any
    end: Any  # its unload starts
    slots: int
    runs: list[Any] = field(default_factory=list)
    askers: list[Any] = field(default_factory=list)  # reactive: which call asked for it


def _ticks_down(seconds: float) -> int:
    return math.floor(seconds / TICK_SECONDS + 1e-9)


def solve(
    cut: Cut,
    *,
    time_limit_seconds: float = 5.0,
    loads_per_copy: int = 2,
    workers: int = 1,
    hint: Mapping[int, Hint] | None = None,
    reactive: bool = False,
    selected: bool = False,
    spec_floor: bool = False,
) -> Optimum:
    """The schedule of ``cut`` with the least total wait (see the module docstring).

    ``time_limit_seconds`` is the solver's deterministic time (its own count of work
    done), so one worker with a fixed seed finds the same schedule on every run however
    busy the machine is; ten times as much wall time is a safety net only. More workers
    search faster but not repeatably. ``hint`` (call id →
    :class:`Hint`, e.g. a policy's run through :func:`hints_from`) only tells the
    search where to start: the answer is no worse than the hinted schedule when that
    schedule fits the model, and otherwise the hint is ignored where it does not fit.

    ``reactive`` adds one rule: a load starts no earlier than the issue of some call it
    serves. The schedule still knows the future (which calls come, how long they run),
    but it cannot have a model ready before anyone asked for it, as no online policy
    can without a forecast.

    ``selected`` is the same rule with the moment the call's agent was selected
    (:attr:`CutCall.selected_at`) in place of its issue: the foresight the spec allows
    an online runtime, which plans a selected agent's first call and starts its load at
    selection ("nothing is loaded without a selected agent behind it").

    ``spec_floor`` is the weakest reading of that sentence: a load of a model starts no
    earlier than the first selection of an agent of *any* call that could run on that
    model, whether or not the copy then serves that call (a plan made for one agent
    may end up serving another's calls). Every runtime that follows the spec obeys it,
    so this optimum is a floor no such runtime can go below: on a cut where it is far
    above the unrestricted optimum, no spec-following placement can come near that.
    """
    if sum((reactive, selected, spec_floor)) > 1:
        raise ValueError("reactive, selected and spec_floor are different rules: pick one")
    from ortools.sat.python import cp_model  # optional dependency: only the bench needs it

    model = cp_model.CpModel()
    releases = [_ticks_down(c.release) for c in cut.calls]
    # The earliest a load for the call may start: when it was issued, or selected.
    asked_at = ([_ticks_down(c.selected_at) for c in cut.calls] if selected or spec_floor
                else releases)
    restricted = reactive or selected
    durations = [max(1, _ticks_down(c.duration)) for c in cut.calls]
    load_ticks = {
        (card.name, m): _ticks_down(size / card.load_rate_mibps)
        for card in cut.cards for m, size in cut.sizes.items()
    }
    unload_ticks = {card.name: _ticks_down(card.unload_seconds) for card in cut.cards}
    horizon = (max(releases, default=0) + sum(durations)
               + sum(load_ticks.values()) * loads_per_copy
               + sum(unload_ticks.values()) * loads_per_copy * len(cut.sizes) + 1)

    # -- copies: (card, model, k) for the k-th load of the model on the card ----------
    copies: dict[tuple[str, str, int], _Copy] = {}
    for card in cut.cards:
        loading: list[Any] = []
        memory: list[Any] = []
        sizes: list[int] = []
        for m, size in cut.sizes.items():
            if size > card.usable_mib:
                continue
            load, unload = load_ticks[(card.name, m)], unload_ticks[card.name]
            previous: _Copy | None = None
            for k in range(loads_per_copy):
                name = f"{card.name}|{m}|{k}"
                present = model.new_bool_var(f"present {name}")
                begin = model.new_int_var(0, horizon, f"load {name}")
                end = model.new_int_var(0, horizon, f"unload {name}")  # the unload starts
                model.add(end >= begin + load).only_enforce_if(present)
                loading.append(model.new_optional_fixed_size_interval_var(
                    begin, load, present, f"loading {name}"))
                held = model.new_int_var(0, horizon, f"held {name}")
                memory.append(model.new_optional_interval_var(
                    begin, held, end + unload, present, f"memory {name}"))
                sizes.append(size)
                if previous is not None:
                    # the copies of one model on one card follow each other, in order
                    model.add_implication(present, previous.present)
                    model.add(begin >= previous.end + unload).only_enforce_if(present)
                copy = _Copy(present, begin, begin + load, end, card.slots)
                copies[(card.name, m, k)] = previous = copy
        model.add_no_overlap(loading)
        model.add_cumulative(memory, sizes, card.usable_mib)

    # -- calls ------------------------------------------------------------------------
    starts: list[Any] = []
    choices: list[list[tuple[tuple[str, str, int], Any]]] = []
    for j, call in enumerate(cut.calls):
        start = model.new_int_var(releases[j], horizon, f"start {j}")
        starts.append(start)
        mine: list[tuple[tuple[str, str, int], Any]] = []
        for where, copy in copies.items():
            if where[1] not in call.models:
                continue
            x = model.new_bool_var(f"call {j} on {where}")
            model.add_implication(x, copy.present)
            model.add(start >= copy.ready).only_enforce_if(x)
            model.add(start + durations[j] <= copy.end).only_enforce_if(x)
            copy.runs.append(model.new_optional_fixed_size_interval_var(
                start, durations[j], x, f"run {j} on {where}"))
            if restricted:
                first = model.new_bool_var(f"call {j} asks for {where}")
                model.add_implication(first, x)
                model.add(copy.begin >= asked_at[j]).only_enforce_if(first)
                copy.askers.append(first)
            mine.append((where, x))
        if not mine:
            raise ValueError(f"call {call.call_id}: no card of the cut holds any of "
                             f"{', '.join(call.models)}")
        model.add_exactly_one(x for _where, x in mine)
        choices.append(mine)
        h = (hint or {}).get(call.call_id)
        if h is not None and any(w == (h.card, h.model, h.load) for w, _x in mine):
            model.add_hint(start, max(releases[j], _ticks_down(h.start)))
            for where, x in mine:
                model.add_hint(x, where == (h.card, h.model, h.load))
    if spec_floor:
        # The first moment some selected agent could want each model: no load before.
        first_wanted = {m: min((asked_at[j] for j, c in enumerate(cut.calls) if m in c.models),
                               default=horizon)
                        for m in cut.sizes}
        for (_card, m, _k), copy in copies.items():
            model.add(copy.begin >= first_wanted[m]).only_enforce_if(copy.present)
    for copy in copies.values():
        if restricted:
            model.add(sum(copy.askers) == copy.present)  # one call asked for the load
        if copy.runs:
            model.add_cumulative(copy.runs, [1] * len(copy.runs), copy.slots)
        else:
            model.add(copy.present == 0)  # a copy no call may use is never worth loading
    model.minimize(sum(starts) - sum(releases))

    solver = cp_model.CpSolver()
    # The limit is in the solver's deterministic time (work done, about a second each
    # on a current core), so one worker finds the same schedule on every run and on a
    # busy machine; the wall-clock limit is only a safety net, and must never be the
    # limit that stops a search. A short search's wall time is mostly not its search:
    # 0.02 s of fleet-16's 40-call cut took 0.16-0.19 s of wall time on an idle core,
    # so ten times the limit alone stopped such searches first on a loaded machine,
    # with no schedule or another one (tests/sim/test_optimum.py); hence the minute.
    solver.parameters.max_deterministic_time = time_limit_seconds
    solver.parameters.max_time_in_seconds = 10 * time_limit_seconds + 60.0
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 1
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"{cut.name}: the solver found no schedule in "
                           f"{time_limit_seconds:g} s ({name})")
    placed: list[Placed] = []
    for j, call in enumerate(cut.calls):
        where = next(w for w, x in choices[j] if solver.boolean_value(x))
        began = solver.value(starts[j]) * TICK_SECONDS
        placed.append(Placed(call.call_id, where[0], where[1], began, began - call.release,
                             where[2]))
    # The objective counts from the rounded issue times; the waits from the true ones.
    rounding = sum(releases) * TICK_SECONDS - sum(c.release for c in cut.calls)
    total = solver.objective_value * TICK_SECONDS + rounding
    bound = solver.best_objective_bound * TICK_SECONDS + rounding
    return Optimum(
        calls=len(cut.calls), total_wait=total, bound_total_wait=bound,
        proven=status == cp_model.OPTIMAL, status=name,
        solve_seconds=solver.wall_time, placed=tuple(placed),
    )
