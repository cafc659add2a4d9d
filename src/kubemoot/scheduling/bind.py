"""Bind: candidate lists and the Deployment env vars an Agent's binding templates.

A phase's candidate list names each model identifier once, for every Ready Model that
passes the rule's require selector. Its score is the quality term alone (prefer weights
or the bias term), which ranks models rather than placements. Order: the bound model,
then score, then identifier. Whether a provider is up or has room is deliberately left
to the per-call runtime, which reads it fresh; keeping it out here means the list, and
the Deployment env that carries it, does not churn when providers come and go.

Beside the lists, the env carries the declared ``vramMib`` of every identifier they
name (:data:`ENV_MODEL_SIZES`): an agent process has no Model resources of its own, and
without them it would size a model nobody has loaded yet from its size on disk.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from kubemoot.api import Phase
from kubemoot.scheduling.candidate import Placement

__all__ = [
    "ENV_BINDING",
    "ENV_CANDIDATES",
    "ENV_MODEL",
    "ENV_MODEL_ENDPOINT",
    "ENV_MODEL_SIZES",
    "ENV_TRIAGE_ENDPOINT",
    "ENV_TRIAGE_MODEL_ID",
    "ENV_UNSCHEDULABLE",
    "CandidateList",
    "candidate_list",
    "candidates_json",
    "declared_sizes",
    "env_score",
    "sizes_json",
    "unset_variables",
    "with_bound_first",
]

ENV_MODEL = "KUBEMOOT_MODEL_MODEL"
ENV_MODEL_ENDPOINT = "KUBEMOOT_MODEL_ENDPOINT"
ENV_TRIAGE_MODEL_ID = "KUBEMOOT_TRIAGE_MODEL_MODEL_ID"
ENV_TRIAGE_ENDPOINT = "KUBEMOOT_TRIAGE_MODEL_ENDPOINT"
#: The declared vramMib of the identifiers the candidate lists name, as a JSON object.
ENV_MODEL_SIZES = "KUBEMOOT_MODEL_SIZES_MIB"
#: Candidate-list env var per phase.
ENV_CANDIDATES: dict[str, str] = {
    Phase.MULLING: "KUBEMOOT_MODEL_CANDIDATES_MULLING",
    Phase.TRIAGE: "KUBEMOOT_MODEL_CANDIDATES_TRIAGE",
}

#: Set while a phase is UNSCHEDULABLE (its FailedScheduling message), in place of its
#: binding: the agent makes no call in that phase and answers with the reason.
ENV_UNSCHEDULABLE: dict[str, str] = {
    Phase.MULLING: "KUBEMOOT_MODEL_UNSCHEDULABLE_REASON",
    Phase.TRIAGE: "KUBEMOOT_TRIAGE_MODEL_UNSCHEDULABLE_REASON",
}
#: The variables that make up each phase's binding.
ENV_BINDING: dict[str, tuple[str, ...]] = {
    Phase.MULLING: (ENV_MODEL, ENV_MODEL_ENDPOINT, ENV_CANDIDATES[Phase.MULLING]),
    Phase.TRIAGE: (ENV_TRIAGE_MODEL_ID, ENV_TRIAGE_ENDPOINT, ENV_CANDIDATES[Phase.TRIAGE]),
}

CandidateList = tuple[tuple[str, float], ...]


def unset_variables(env: Mapping[str, str]) -> frozenset[str]:
    """The variables a Deployment must lose when it takes ``env``.

    A phase whose reason is set loses its binding; a phase bound again loses its
    reason. A phase ``env`` says nothing about (deferred) keeps what it has.
    """
    unset: set[str] = set()
    for phase, reason in ENV_UNSCHEDULABLE.items():
        binding = ENV_BINDING[phase]
        if reason in env:
            unset.update(binding)
        elif binding[0] in env:
            unset.add(reason)
    return frozenset(unset)


def env_score(score: float) -> int | float:
    """70.0 prints as 70, as in the spec's example; fractions keep six decimals."""
    return int(score) if float(score).is_integer() else round(score, 6)


def candidate_list(admitted: Iterable[Placement], quality: Mapping[str, float]) -> CandidateList:
    """One entry per identifier (its best quality score), by score then identifier."""
    best: dict[str, float] = {}
    for placement in admitted:
        score = quality[placement.name]
        model_id = placement.model_id
        if model_id not in best or score > best[model_id]:
            best[model_id] = score
    return tuple(sorted(best.items(), key=lambda item: (-item[1], item[0])))


def with_bound_first(candidates: CandidateList, bound: str | None) -> CandidateList:
    """The same list with the bound identifier moved to the front."""
    if bound is None or not candidates or candidates[0][0] == bound:
        return candidates
    first = [item for item in candidates if item[0] == bound]
    return tuple(first + [item for item in candidates if item[0] != bound])


def candidates_json(candidates: Sequence[tuple[str, float]]) -> str:
    """Compact JSON like the spec's ``[{"model":"qwen3:32b","score":70}, …]``."""
    return json.dumps(
        [{"model": model, "score": env_score(score)} for model, score in candidates],
        separators=(",", ":"),
    )


def declared_sizes(admitted: Iterable[Placement]) -> dict[str, int]:
    """Each identifier's declared ``vramMib``; Models that declare none are left out.

    Where Models on several providers share an identifier and declare different sizes,
    the largest wins: a cold load claimed too small is the costlier mistake (the engine
    itself then evicts or refuses), one claimed too large only waits a little longer.
    """
    sizes: dict[str, int] = {}
    for placement in admitted:
        declared = placement.model.spec.vram_mib
        if declared is not None:
            model_id = placement.model_id
            sizes[model_id] = max(declared, sizes.get(model_id, 0))
    return sizes


def sizes_json(sizes: Mapping[str, int]) -> str:
    """Compact JSON like ``{"qwen3:14b":9216,"qwen3:8b":5120}``, keys sorted."""
    return json.dumps(dict(sorted(sizes.items())), separators=(",", ":"))
