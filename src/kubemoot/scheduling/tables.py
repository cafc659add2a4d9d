"""The agent-independent tables of a pass: the Models as columns, rule tables, rankings.

A pass judges every (policy, phase) against every Model and ranks the survivors once per
effective bias. Done object by object, that bookkeeping costs more than the selectors
themselves, so the Models are indexed once (:class:`ModelIndex`: one list per fact, a
Model is a position in name order) and tables and rankings hold positions. Selectors and
quality scores depend on a Model's labels only, so they run once per distinct label set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import Literal

from kubemoot.api import SchedulingRule
from kubemoot.gates import GateResult, Standing
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins import (
    CapacityScorer,
    ImageLocalityScorer,
    JudgedGate,
    ProviderWeightScorer,
    RequireGate,
    quality_score,
    topology_value,
)

__all__ = [
    "ModelIndex",
    "ProviderTier",
    "QualityFunction",
    "Ranked",
    "Ranking",
    "RuleTable",
    "quality_function",
    "quality_signature",
    "tie_break",
]

#: A quality score as a function of a Model's labels.
QualityFunction = Callable[[Mapping[str, str]], float]


def tie_break(placement: Placement) -> tuple[bool, int, str]:
    """Equal scores: smaller declared vramMib first (undeclared last), then Model name."""
    declared = placement.model.spec.vram_mib
    return (declared is None, declared or 0, placement.name)


def quality_function(rule: SchedulingRule | None, bias: float | None) -> QualityFunction:
    """The quality score as a function of a Model's labels (see :func:`quality_score`)."""
    if rule is not None and rule.prefer:
        return partial(quality_score, rule=rule, bias=None, bias_active=False)
    if bias is not None:
        return partial(quality_score, rule=rule, bias=bias, bias_active=True)
    return _no_quality


def quality_signature(rule: SchedulingRule | None, bias: float | None) -> tuple[object, ...]:
    """Equal for two (rule, bias) pairs whose quality functions agree on every label set."""
    if rule is not None and rule.prefer:
        return ("prefer", tuple((term.weight, term.selector) for term in rule.prefer))
    return ("none",) if bias is None else ("bias", bias)


def _no_quality(labels: Mapping[str, str]) -> float:
    return 0.0


class ModelIndex:
    """The pass's candidates as columns; position ``i`` is the ``i``-th Model by name."""

    def __init__(self, placements: Sequence[Placement], headroom: Mapping[str, int]) -> None:
        self.placements = tuple(placements)
        self.names = [placement.name for placement in self.placements]
        self.providers = [placement.model.spec.provider_ref for placement in self.placements]
        #: Agents each Model's provider may still take; None when its limit is unknown.
        self.headroom = [headroom.get(provider) for provider in self.providers]
        self.label_sets: list[Mapping[str, str]] = []  # the distinct label sets
        self.set_of: list[int] = []  # position → its label set
        self.set_of_name: dict[str, int] = {}
        self.ready_by_set: list[list[int]] = []  # label set → positions of Ready Models
        known: dict[frozenset[tuple[str, str]], int] = {}
        for position, placement in enumerate(self.placements):
            labels = placement.model.metadata.labels
            label_set = known.setdefault(frozenset(labels.items()), len(known))
            if label_set == len(self.label_sets):
                self.label_sets.append(labels)
                self.ready_by_set.append([])
            self.set_of.append(label_set)
            self.set_of_name[placement.name] = label_set
            if placement.model.is_ready:
                self.ready_by_set[label_set].append(position)
        ordered = sorted(range(len(self.placements)), key=lambda i: tie_break(self.placements[i]))
        self.tie_rank = [0] * len(ordered)
        for rank, position in enumerate(ordered):
            self.tie_rank[position] = rank
        self._topology: dict[str | None, list[str | None]] = {}
        self._terms: dict[str, tuple[list[float], list[float], list[float], list[bool]]] = {}

    def topology(self, key: str | None) -> list[str | None]:
        """Every Model's value for a topology key (None without a key)."""
        found = self._topology.get(key)
        if found is None:
            found = self._topology[key] = [
                None if key is None else topology_value(placement, key)
                for placement in self.placements
            ]
        return found

    def terms(
        self,
        phase: str,
        positions: Iterable[int],
        *,
        strategy: Literal["spread", "binpack"],
        weights: Mapping[str, float],
    ) -> tuple[list[float], list[float], list[float]]:
        """Weighted capacity, locality and provider-weight columns for ``phase``.

        Filled in for ``positions`` (scorers run on feasible candidates only); other
        entries are 0 and never read.
        """
        found = self._terms.get(phase)
        if found is None:
            size = len(self.placements)
            found = self._terms[phase] = ([0.0] * size, [0.0] * size, [0.0] * size, [False] * size)
        capacity, locality, weight, done = found
        scorers = None
        for position in positions:
            if done[position]:
                continue
            if scorers is None:
                scorers = (
                    CapacityScorer(strategy),
                    ImageLocalityScorer(),
                    ProviderWeightScorer(phase),
                )
            placement = self.placements[position]
            capacity[position] = weights["Capacity"] * scorers[0].score(placement)
            locality[position] = weights["ImageLocality"] * scorers[1].score(placement)
            weight[position] = weights["ProviderWeight"] * scorers[2].score(placement)
            done[position] = True
        return capacity, locality, weight

    def select(self, members: Sequence[Sequence[int]], label_sets: Iterable[int]) -> list[int]:
        """Positions of the given label sets' members, in name order."""
        return sorted(chain.from_iterable(members[label_set] for label_set in label_sets))

    def by_tie_break(self, positions: Iterable[int]) -> tuple[int, ...]:
        """Positions in tie-break order (smaller declared vramMib, then name)."""
        return tuple(sorted(positions, key=self.tie_rank.__getitem__))


@dataclass(slots=True)
class ProviderTier:
    """Provider-tier verdicts of every Model, for one freshness limit.

    A pass needs each Model's standing, which the gates' verdicts decide; the results
    with their reasons and evidence are read only by decision records and by the
    messages of unplaced phases, for a few Models. They are made on first read, by the
    same gates, and kept.
    """

    max_age_seconds: int
    gates: tuple[JudgedGate, ...]  # the provider-tier gates, in gate order
    placements: Mapping[str, Placement]  # by Model name
    standing: dict[str, Standing]
    #: Per Model position: how many Agents its provider may still take before the
    #: Parallelism gate FAILs (its headroom); None when that gate never FAILs there
    #: (no provider, no known limit, or a stale status, which makes it STALE instead).
    limits: list[int | None]
    #: The position in ``gates`` of each Model's first FAIL, for Models that have one.
    first_failing: dict[str, int]
    #: Per label set: positions of its statically feasible and uncertain Models.
    feasible_by_set: list[list[int]]
    uncertain_by_set: list[list[int]]
    _results: dict[str, tuple[GateResult, ...]] = field(default_factory=dict)

    def results(self, name: str) -> tuple[GateResult, ...]:
        """Every provider-tier result of one Model, in gate order (made on first read)."""
        found = self._results.get(name)
        if found is None:
            placement = self.placements[name]
            found = self._results[name] = tuple(gate.check(placement) for gate in self.gates)
        return found

    def first_fail(self, name: str) -> GateResult | None:
        """The Model's first FAIL among the provider-tier gates, if any."""
        index = self.first_failing.get(name)
        return None if index is None else self.results(name)[index]


@dataclass(slots=True, eq=False)
class RuleTable:
    """One (policy, phase): which Models the require admits, and their static standing."""

    phase: str
    rule: SchedulingRule | None
    tier: ProviderTier
    index: ModelIndex
    admits: tuple[bool, ...]  # per label set: does the require selector admit it
    feasible_positions: tuple[int, ...]  # statically feasible, in tie-break order
    uncertain_positions: tuple[int, ...]  # statically uncertain, by name
    admitted_positions: tuple[int, ...]  # Ready Models the require admits, by name
    rankings: dict[float | None, Ranking] = field(default_factory=dict)
    _gate: RequireGate | None = None

    @property
    def feasible(self) -> list[Placement]:
        """Statically feasible candidates, by name."""
        return [self.index.placements[i] for i in sorted(self.feasible_positions)]

    @property
    def uncertain(self) -> list[Placement]:
        """Statically uncertain candidates (UNKNOWN or STALE evidence), by name."""
        return [self.index.placements[i] for i in self.uncertain_positions]

    @property
    def admitted(self) -> list[Placement]:
        """Ready Models the require admits: the phase's candidate list, by name."""
        return [self.index.placements[i] for i in self.admitted_positions]

    @property
    def require_gate(self) -> RequireGate:
        """The rule's Require gate; its two results are built only when a record needs them."""
        if self._gate is None:
            self._gate = RequireGate(self.rule)
        return self._gate

    def rejects(self, name: str) -> bool:
        """Whether the require selector turns the Model away."""
        return not self.admits[self.index.set_of_name[name]]

    def require_result(self, name: str) -> GateResult:
        """The Require result of one Model."""
        gate = self.require_gate
        return gate.failed if self.rejects(name) else gate.passed

    def first_failure(self, name: str) -> GateResult | None:
        """Require's FAIL, else the provider tier's first FAIL, else None."""
        if self.rejects(name):
            return self.require_gate.failed
        return self.tier.first_fail(name)


@dataclass(frozen=True, slots=True)
class Ranked:
    """One statically feasible candidate with its total score."""

    placement: Placement
    score: float
    provider: str
    topology: str | None


@dataclass(slots=True, eq=False)
class Ranking:
    """A rule table's feasible candidates for one effective bias, best first."""

    table: RuleTable
    bias: float | None
    bias_active: bool
    order: tuple[int, ...]  # Model positions, best first
    scores: tuple[float, ...]  # total score of each, aligned with ``order``
    by_label_set: list[float]  # quality score of each label set
    topology: Sequence[str | None]  # every Model's topology value
    #: Equal for rankings of any table that order and score candidates the same way.
    signature: tuple[object, ...]
    _quality: dict[str, float] | None = None

    @property
    def quality(self) -> Mapping[str, float]:
        """Quality score of every admitted Model, by name (the candidate list's scores)."""
        if self._quality is None:
            index = self.table.index
            by_set, set_of, names = self.by_label_set, index.set_of, index.names
            self._quality = {names[i]: by_set[set_of[i]] for i in self.table.admitted_positions}
        return self._quality

    def entry(self, rank: int) -> Ranked:
        """The candidate at ``rank`` (0 is the best)."""
        position = self.order[rank]
        index = self.table.index
        return Ranked(
            index.placements[position],
            self.scores[rank],
            index.providers[position],
            self.topology[position],
        )
