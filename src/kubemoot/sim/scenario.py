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

import math
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from kubemoot.api.bounds import (
    MAX_AGENTS,
    MAX_ITEMS,
    ContextTokens,
    Count,
    Mib,
    Parallel,
    Rate,
    Score,
    Seconds,
    Seed,
)
from kubemoot.api.errors import InputError
from kubemoot.api.loader import validate_document
from kubemoot.api.meta import EitherMibSpelling
from kubemoot.emulation.engine import OLLAMA_KEEP_ALIVE_SECONDS
from kubemoot.settings import DEFAULTS

__all__ = [
    "CandidateSpec",
    "CrewSpec",
    "FanOutSpec",
    "LatencySpec",
    "PhaseSpec",
    "Scenario",
    "ScenarioModel",
    "ScenarioProvider",
    "ScenarioSettings",
    "load_scenario",
    "parse_scenario",
]

KIND = "SimulationScenario"

# What one scenario may ask of the simulator, beyond each field's own bound (see
# kubemoot.api.bounds): the products of fields are what cost time and memory. The
# shipped scale scenario (1,000 cards, 10,000 agents, 30 minutes) sits well inside.
MAX_SIMULATED_SECONDS = 30 * 24 * 3600.0  # 30 days of virtual time
MAX_CV = 100.0  # coefficient of variation of a call's duration
MAX_PROVIDERS = 10_000  # cards, all groups counted
MAX_TOTAL_AGENTS = 100_000  # agents, all crews counted
MAX_EXPECTED_CALLS = 500_000  # calls the workload is expected to issue, per policy
MAX_SAMPLES = 100_000  # VRAM samples per card: durationSeconds / sampleSeconds


def _alias(name: str) -> str:
    camel = to_camel(name)
    return camel.replace("Mib", "MiB").replace("Mibps", "MiBps")


class _Spec(EitherMibSpelling):
    model_config = ConfigDict(
        alias_generator=_alias, populate_by_name=True, extra="forbid", frozen=True,
        allow_inf_nan=False,
    )


class ScenarioModel(_Spec):
    """A model: its VRAM occupancy (weights plus KV slab), as Ollama would report it."""

    name: str = Field(min_length=1)
    vram_mib: Mib = Field(gt=0)


class ScenarioProvider(_Spec):
    """One GPU (or ``count`` identical ones)."""

    name: str = Field(min_length=1)
    vram_mib: Mib = Field(gt=0)
    reserve_mib: Mib = DEFAULTS.reserve_mib
    max_parallel: Parallel = 1
    load_rate_mibps: Rate | None = Field(default=None, gt=0)
    unload_seconds: Seconds | None = None
    context_length: ContextTokens | None = None
    count: int = Field(default=1, ge=1, le=MAX_PROVIDERS)

    @model_validator(mode="after")
    def _memory_left(self) -> ScenarioProvider:
        if self.reserve_mib >= self.vram_mib:  # the engine would offer nothing
            raise ValueError(
                f"reserveMiB ({self.reserve_mib}) must be less than vramMiB ({self.vram_mib})"
            )
        return self


class LatencySpec(_Spec):
    """Call duration: lognormal with this mean and coefficient of variation."""

    mean_seconds: Seconds = Field(gt=0)
    # A lognormal with a larger spread is all outliers; the bound keeps log1p(cv²) finite.
    cv: float = Field(default=0.5, ge=0, le=MAX_CV)


class FanOutSpec(_Spec):
    """Tool fan-out: with this probability a step is a burst of ``width`` parallel calls."""

    probability: float = Field(default=0.0, ge=0, le=1)
    width: Parallel = 1


class CandidateSpec(_Spec):
    """One entry of a phase's candidate list (preferred first), as the operator publishes."""

    model: str
    score: Score = 0.0


class PhaseSpec(_Spec):
    """One phase of an agent's turn in a discussion: ``steps`` calls in sequence."""

    name: str = Field(min_length=1)
    candidates: list[CandidateSpec] = Field(min_length=1, max_length=MAX_ITEMS)
    steps: Count = Field(default=1, ge=1)
    latency: LatencySpec
    fan_out: FanOutSpec = Field(default_factory=FanOutSpec)
    prompt_tokens: ContextTokens = 2048
    think_seconds: Seconds = 0.0  # gap between one call and the next
    #: Tokens each step adds to its agent's thread: with more than 0, every call re-sends
    #: the thread so far (``promptTokens`` of instructions, then every earlier step's
    #: tokens), as a crew's long discussion does; an engine slot that served the
    #: thread's previous call holds most of it in its prompt cache.
    thread_tokens: int = Field(default=0, ge=0, le=1_000_000)


class CrewSpec(_Spec):
    """A crew (or ``count`` identical crews) of agents running discussions."""

    name: str = Field(min_length=1)
    agents: int = Field(ge=1, le=MAX_AGENTS)
    count: int = Field(default=1, ge=1, le=MAX_TOTAL_AGENTS)
    discussions_per_hour: Rate = Field(gt=0)
    agents_per_discussion: int = Field(default=1, ge=1, le=MAX_AGENTS)
    phases: list[PhaseSpec] = Field(min_length=1, max_length=MAX_ITEMS)

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

    load_rate_mibps: Rate = Field(default=DEFAULTS.load_rate_mibps, gt=0)
    unload_seconds: Seconds = DEFAULTS.unload_seconds
    keep_alive_seconds: Seconds = OLLAMA_KEEP_ALIVE_SECONDS
    gpu_wait_limit_seconds: Seconds = Field(default=DEFAULTS.gpu_wait_limit_seconds, gt=0)
    sample_seconds: Seconds = Field(default=10.0, gt=0)  # VRAM-over-time plot resolution


class ScenarioSpec(_Spec):
    duration_seconds: float = Field(gt=0, le=MAX_SIMULATED_SECONDS)
    seed: Seed = 1
    settings: ScenarioSettings = Field(default_factory=ScenarioSettings)
    models: list[ScenarioModel] = Field(min_length=1, max_length=MAX_ITEMS)
    providers: list[ScenarioProvider] = Field(min_length=1, max_length=MAX_ITEMS)
    crews: list[CrewSpec] = Field(min_length=1, max_length=MAX_ITEMS)

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
        problem = self.workload_problem()
        if problem is not None:
            raise ValueError(problem)
        return self

    def expected_calls(self) -> float:
        """The mean number of calls the workload issues: discussions × agents × steps."""
        total = 0.0
        for crew in self.crews:
            discussions = crew.count * crew.discussions_per_hour * self.duration_seconds / 3600
            per_turn = sum(
                phase.steps * (1 + phase.fan_out.probability * (phase.fan_out.width - 1))
                for phase in crew.phases
            )
            total += discussions * crew.agents_per_discussion * per_turn
        return total

    def workload_problem(self) -> str | None:
        """Why this scenario is too big to simulate, or None when it fits the limits."""
        providers = sum(p.count for p in self.providers)
        if providers > MAX_PROVIDERS:
            return (
                f"{providers:,} providers in all (counts included); "
                f"the limit is {MAX_PROVIDERS:,}"
            )
        agents = sum(c.count * c.agents for c in self.crews)
        if agents > MAX_TOTAL_AGENTS:
            return (
                f"{agents:,} agents in all (counts included); the limit is {MAX_TOTAL_AGENTS:,}"
            )
        calls = self.expected_calls()
        if calls > MAX_EXPECTED_CALLS:
            return (
                f"the workload would issue about {calls:,.0f} calls in durationSeconds "
                f"{self.duration_seconds:g}; the limit is {MAX_EXPECTED_CALLS:,} (shorten the "
                "duration or lower discussionsPerHour, counts, agents or steps)"
            )
        samples = self.duration_seconds / self.settings.sample_seconds
        if samples > MAX_SAMPLES:
            return (
                f"durationSeconds / settings.sampleSeconds is {samples:,.0f} VRAM samples; "
                f"the limit is {MAX_SAMPLES:,}"
            )
        return None


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

    def with_duration(self, seconds: float, *, field: str = "durationSeconds") -> Scenario:
        """A copy that runs for ``seconds`` of virtual time.

        The duration must be positive, finite, at most :data:`MAX_SIMULATED_SECONDS`, and
        keep the workload inside the limits; otherwise an :class:`InputError` names
        ``field`` (the CLI passes its ``--duration`` flag).
        """
        problem = duration_problem(seconds)
        if problem is not None:
            raise InputError(problem, field=field)
        spec = self.spec.model_copy(update={"duration_seconds": seconds})
        problem = spec.workload_problem()
        if problem is not None:
            raise InputError(problem, field=field)
        return self.model_copy(update={"spec": spec})


def duration_problem(seconds: float) -> str | None:
    """Why ``seconds`` cannot be a simulated duration, or None."""
    if not math.isfinite(seconds) or seconds <= 0:
        return f"must be a positive number of seconds, got {seconds:g}"
    if seconds > MAX_SIMULATED_SECONDS:
        return f"must be at most {MAX_SIMULATED_SECONDS:g} seconds (30 days), got {seconds:g}"
    return None


def parse_scenario(
    data: Any, *, file: str | None = None, document: int | None = None
) -> Scenario:
    """Validate one scenario document (already parsed YAML)."""
    if not isinstance(data, dict):
        raise InputError("a scenario must be a mapping", file=file, document=document)
    kind = data.get("kind")
    if kind != KIND:
        raise InputError(
            f"kind must be {KIND}, got {kind!r}", file=file, document=document, field="kind"
        )
    name = (data.get("metadata") or {}).get("name") if isinstance(data.get("metadata"), dict) \
        else None
    return validate_document(Scenario, data, file=file, document=document, kind=KIND, name=name)


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
    return parse_scenario(doc.data, file=doc.file, document=doc.index)
