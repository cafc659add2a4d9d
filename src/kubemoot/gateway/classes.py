"""ModelClass virtual names, resolved by the control plane's own candidate machinery.

A :class:`~kubemoot.api.modelclass.ModelClass` from the bundle is ranked once, at
start-up, by :func:`~kubemoot.scheduling.model_class.resolve_model_class` over the
bundle's Models and providers. A call for the class's name gets that ranked list; the
per-call runtime takes any candidate within tolerance, as it does for an agent.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from kubemoot.api.model import Model
from kubemoot.api.modelclass import ModelClass
from kubemoot.api.provider import ModelProvider
from kubemoot.gateway.app import VirtualModels
from kubemoot.runtime.placement import CandidateModel
from kubemoot.scheduling.model_class import ModelClassCandidates, resolve_model_class

__all__ = ["ModelClassBook", "runtime_candidates"]


def runtime_candidates(resolved: ModelClassCandidates,
                       runtime_tolerance: float) -> list[CandidateModel]:
    """The class's candidates in the runtime's terms.

    The runtime admits candidates within *its* tolerance of the preferred score; a
    class states its own. Scaling every score by ``runtime ÷ class`` tolerance keeps
    the order and makes the runtime admit exactly the class's in-tolerance candidates.
    """
    pairs = list(resolved.candidates)
    if not pairs:
        return []
    tolerance = resolved.tolerance
    if tolerance is None:
        return [CandidateModel(model, score) for model, score in pairs]
    if tolerance == 0:
        return [CandidateModel(pairs[0][0], pairs[0][1])]
    factor = runtime_tolerance / tolerance
    return [CandidateModel(model, score * factor) for model, score in pairs]


class ModelClassBook(VirtualModels):
    """The ModelClasses of a bundle, each ranked once."""

    def __init__(self, classes: Iterable[ModelClass], models: Iterable[Model],
                 providers: Iterable[ModelProvider], *, runtime_tolerance: float,
                 now: datetime | None = None) -> None:
        models, providers = list(models), list(providers)
        when = now or datetime.now(UTC)
        self._lists: dict[str, list[CandidateModel]] = {}
        for model_class in classes:
            resolved = resolve_model_class(model_class, models, providers, now=when,
                                           default_tolerance=runtime_tolerance)
            self._lists[model_class.name] = runtime_candidates(resolved, runtime_tolerance)

    def names(self) -> list[str]:
        return sorted(self._lists)

    def candidates(self, name: str) -> list[CandidateModel] | None:
        found = self._lists.get(name)
        return list(found) if found else None
