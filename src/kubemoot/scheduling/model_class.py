"""A ModelClass's ranked candidate list, made by the control plane's own machinery.

A ModelClass is a virtual model name (DESIGN §9). Its candidates are exactly what a
policy rule with the same ``require`` and ``prefer`` (or quality bias) would publish
for a phase: every Ready Model the selector admits, one entry per identifier with its
quality score, the preferred (best-placed) identifier first, then by score, then by
identifier. The rule table, the quality terms and the ranking are the framework's, so
the bias formula and the selector semantics have one home. Pure: ``now`` is a
parameter, nothing is read or written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from kubemoot.api import (
    DEFAULT_MAX_AGE_SECONDS,
    Model,
    ModelClass,
    ModelProvider,
    SchedulerSettings,
    SchedulingRule,
)
from kubemoot.scheduling.bias import parse_bias
from kubemoot.scheduling.bind import (
    CandidateList,
    candidate_list,
    candidates_json,
    with_bound_first,
)
from kubemoot.scheduling.framework import Framework
from kubemoot.scheduling.snapshot import ClusterSnapshot

__all__ = ["MODEL_CLASS_PHASE", "ModelClassCandidates", "resolve_model_class"]

#: The phase name a class is ranked under. It is neither mulling nor triage, so no
#: provider-weight term applies: a class ranks models, not discussion roles.
MODEL_CLASS_PHASE = "modelclass"


@dataclass(frozen=True, slots=True)
class ModelClassCandidates:
    """What a ModelClass stands for right now."""

    name: str  # the ModelClass's name: the virtual model name clients use
    #: (identifier, quality score) pairs: the preferred identifier first, then by score
    #: (highest first), then by identifier — the control plane's candidate-list order.
    candidates: CandidateList
    #: The identifier the control plane would bind (best total score among feasible
    #: Models); None when no candidate is feasible, e.g. when no providers were given.
    preferred: str | None
    #: Points below the first candidate's score a call may still use; None means the
    #: runtime's own candidate tolerance (when no default was passed in).
    tolerance: float | None

    def to_json(self) -> str:
        """The list in the published JSON shape, ``[{"model": …, "score": …}, …]``."""
        return candidates_json(self.candidates)


def resolve_model_class(
    model_class: ModelClass,
    models: Iterable[Model],
    providers: Iterable[ModelProvider] = (),
    *,
    now: datetime,
    settings: SchedulerSettings | None = None,
    default_tolerance: float | None = None,
) -> ModelClassCandidates:
    """Rank ``model_class``'s candidates over ``models`` (and their ``providers``).

    Without providers every admitted Ready Model is still listed, by score then
    identifier, and none is preferred. ``default_tolerance`` (the runtime's candidate
    tolerance) fills in a class that states none.
    """
    snapshot = ClusterSnapshot.build(models=models, providers=providers)
    framework = Framework(snapshot.placements, now=now,
                          settings=settings or snapshot.settings)
    spec = model_class.spec
    rule = SchedulingRule(phase=MODEL_CLASS_PHASE, require=spec.require, prefer=spec.prefer)
    table = framework.rule_table(MODEL_CLASS_PHASE, rule,
                                 max_age_seconds=DEFAULT_MAX_AGE_SECONDS)
    bias = None if spec.quality_bias is None else parse_bias(spec.quality_bias)
    ranking = framework.ranking(table, bias=bias, bias_active=bias is not None,
                                topology_key=None)
    preferred = ranking.entry(0).placement.model_id if ranking.order else None
    listed = with_bound_first(candidate_list(table.admitted, ranking.quality), preferred)
    tolerance = spec.tolerance if spec.tolerance is not None else default_tolerance
    return ModelClassCandidates(model_class.name, listed, preferred, tolerance)
