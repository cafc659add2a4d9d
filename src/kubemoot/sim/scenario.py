"""The scenario file: a fleet, its models, and the crews that load it.

A scenario is one YAML document of kind ``SimulationScenario``. Field names are
camelCase like the CRDs. Groups (``count``) keep big fleets short to write: a provider
group of ``count: 300`` becomes providers ``<name>-000`` … ``<name>-299``.

Example::

    apiVersion: kubemoot.ai/v1alpha1
    kind: SimulationScenario
    metadata: {name: tiny}
    spec:
      durationSeconds: 600
      models: [{name: "qwen3:8b", vramMiB: 6144}]
      providers: [{name: gpu, vramMiB: 24576, maxParallel: 2}]
      crews:
      - name: crew
        agents: 3
        discussionsPerHour: 30
        agentsPerDiscussion: 2
        phases:
        - {name: mulling, candidates: [{model: "qwen3:8b", score: 50}], steps: 2,
           latency: {meanSeconds: 10, cv: 0.5}}

Loading never raises anything but :class:`~kubemoot.api.errors.InputError`, which
names the file and the offending field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from kubemoot.api.errors import InputError

__all__ = [
    "CandidateSpec",
    "CrewSpec",
    "FanOutSpec",
    "LatencySpec",
    "ModelSpec",
    "PhaseSpec",
    "ProviderSpec",
    "Scenario",
    "ScenarioSettings",
    "load_scenario",
    "parse_scenario",
]

KIND = "SimulationScenario"


def _alias(name: str) -> str:
    camel = to_camel(name)
    return camel.replace("Mib", "MiB").replace("Mibps", "MiBps")


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=_alias, populate_by_name=True, extra="forbid", frozen=True
    )


class ModelSpec(_Spec):
    """A model: its VRAM occupancy (weights plus KV slab), as Ollama would report it."""

    name: str = Field(min_length=1)
    vram_mib: int = Field(gt=0)


class ProviderSpec(_Spec):
    """One GPU (or ``count`` identical ones)."""

    name: str = Field(min_length=1)
    vram_mib: int = Field(gt=0)
    reserve_mib: int = Field(default=1024, ge=0)
    max_parallel: int = Field(default=1, ge=1)
    load_rate_mibps: float | None = Field(default=None, gt=0)
    unload_seconds: float | None = Field(default=None, ge=0)
    context_length: int | None = Field(default=None, gt=0)
    count: int = Field(default=1, ge=1)


class LatencySpec(_Spec):
    """Call duration: lognormal with this mean and coefficient of variation."""

    mean_seconds: float = Field(gt=0)
    cv: float = Field(default=0.5, ge=0)


class FanOutSpec(_Spec):
    """Tool fan-out: with this probability a step is a burst of ``width`` parallel calls."""

    probability: float = Field(default=0.0, ge=0, le=1)
    width: int = Field(default=1, ge=1)


class CandidateSpec(_Spec):
    """One entry of a phase's candidate list (preferred first), as the operator publishes."""

    model: str
    score: float = 0.0


class PhaseSpec(_Spec):
    """One phase of an agent's turn in a discussion: ``steps`` calls in sequence."""

    name: str = Field(min_length=1)
    candidates: list[CandidateSpec] = Field(min_length=1)
    steps: int = Field(default=1, ge=1)
    latency: LatencySpec
    fan_out: FanOutSpec = Field(default_factory=FanOutSpec)
    prompt_tokens: int = Field(default=2048, ge=1)
    think_seconds: float = Field(default=0.0, ge=0)  # gap between one call and the next


class CrewSpec(_Spec):
    """A crew (or ``count`` identical crews) of agents running discussions."""

    name: str = Field(min_length=1)
    agents: int = Field(ge=1)
    count: int = Field(default=1, ge=1)
    discussions_per_hour: float = Field(gt=0)
    agents_per_discussion: int = Field(default=1, ge=1)
    phases: list[PhaseSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _enough_agents(self) -> CrewSpec:
        if self.agents_per_discussion > self.agents:
            raise ValueError(
                f"agentsPerDiscussion ({self.agents_per_discussion}) exceeds agents "
                f"({self.agents})"
            )
        return self


class ScenarioSettings(_Spec):
    """Engine and runtime numbers shared by every provider unless it says its own."""

    load_rate_mibps: float = Field(default=1024.0, gt=0)
    unload_seconds: float = Field(default=1.0, ge=0)
    keep_alive_seconds: float = Field(default=300.0, ge=0)
    gpu_wait_limit_seconds: float = Field(default=90.0, gt=0)
    sample_seconds: float = Field(default=10.0, gt=0)  # VRAM-over-time plot resolution


class ScenarioSpec(_Spec):
    duration_seconds: float = Field(gt=0)
    seed: int = 1
    settings: ScenarioSettings = Field(default_factory=ScenarioSettings)
    models: list[ModelSpec] = Field(min_length=1)
    providers: list[ProviderSpec] = Field(min_length=1)
    crews: list[CrewSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> ScenarioSpec:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("model names must be unique")
        known = set(names)
        for crew in self.crews:
            for phase in crew.phases:
                for cand in phase.candidates:
                    if cand.model not in known:
                        raise ValueError(
                            f"crew {crew.name!r} phase {phase.name!r} names unknown model "
                            f"{cand.model!r}"
                        )
        providers = [p.name for p in self.providers]
        if len(set(providers)) != len(providers):
            raise ValueError("provider names must be unique")
        return self


class Metadata(_Spec):
    name: str = Field(min_length=1)


class Scenario(_Spec):
    """A parsed scenario document."""

    api_version: str = "kubemoot.ai/v1alpha1"
    kind: str = KIND
    metadata: Metadata
    spec: ScenarioSpec

    @property
    def name(self) -> str:
        return self.metadata.name

    def scaled(self, factor: float) -> Scenario:
        """A smaller copy: fewer providers and crews, same shape (for quick runs and CI).

        ``factor`` is the share kept, in (0, 1]; anything else is an :class:`InputError`
        (the CLI checks its ``--scale-down`` flag before calling, so the user sees the flag).
        """
        if not 0 < factor <= 1:
            raise InputError(f"the share kept must be in (0, 1], got {factor:g}",
                             field="factor")
        spec = self.spec
        providers = [
            p.model_copy(update={"count": max(1, round(p.count * factor))}) for p in spec.providers
        ]
        crews = [
            c.model_copy(update={"count": max(1, round(c.count * factor))}) for c in spec.crews
        ]
        return self.model_copy(
            update={"spec": spec.model_copy(update={"providers": providers, "crews": crews})}
        )

    def with_duration(self, seconds: float) -> Scenario:
        """A copy that runs for ``seconds`` of virtual time (must be positive)."""
        if seconds <= 0:
            raise InputError(f"the duration must be positive, got {seconds:g}",
                             field="durationSeconds")
        return self.model_copy(
            update={"spec": self.spec.model_copy(update={"duration_seconds": seconds})}
        )


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def parse_scenario(data: Any, *, file: str | None = None) -> Scenario:
    """Validate one scenario document (already parsed YAML)."""
    if not isinstance(data, dict):
        raise InputError("a scenario must be a mapping", file=file)
    kind = data.get("kind")
    if kind != KIND:
        raise InputError(f"kind must be {KIND}, got {kind!r}", file=file, field="kind")
    name = (data.get("metadata") or {}).get("name") if isinstance(data.get("metadata"), dict) \
        else None
    try:
        return Scenario.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        raise InputError(
            first["msg"], file=file, kind=KIND, name=name, field=_field_path(first["loc"]) or None
        ) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (``-`` reads stdin).

    Reading goes through the resource loader, so a missing file, bytes that are not
    UTF-8 and broken YAML are reported the same way as for every other command.
    """
    from kubemoot.api.loader import iter_documents

    docs = list(iter_documents([path]))
    if len(docs) != 1:
        raise InputError(f"expected one scenario document, found {len(docs)}", file=str(path))
    doc = docs[0]
    return parse_scenario(doc.data, file=doc.file)
