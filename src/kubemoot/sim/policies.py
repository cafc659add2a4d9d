"""Placement policies the simulator compares, all on the same emulated engines.

The baselines model what people run today in front of several Ollama servers. They
route each call to a card for its *preferred* model only, and whatever happens on that
card is Ollama's own behaviour (the engine evicts idle models, shortest keep-alive
first, and loads serially):

* ``static`` — reconcile-time binding only (the design the spec replaced): before any
  traffic each (agent, phase) is bound to one card by the operator-side rule: the card
  must be able to hold the model, the parallelism gate (agents + 1 ≤ 4 × slots) is
  honoured when any card passes it, and the score is the card's free share of memory
  after the models already bound there (spread, 0–100) plus 20 when the model is
  already bound there (image locality). Ties by card name.
* ``round-robin`` — each model's calls rotate over the cards that can hold it.
* ``least-busy`` — LiteLLM's: the card with the fewest calls this router has in flight.
* ``random`` — Open WebUI's: a uniformly random card among those that can hold it.
* ``herd-like`` — a weighted score as ollama-herd describes: model already loaded (+50),
  memory fits without eviction (+25), minus 10 per queued or running request.

The ``kubemoot`` policy (the production runtime) lives in :mod:`kubemoot.sim.runtime_policy`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field
from typing import ClassVar

from kubemoot.providers.protocol import ProviderError
from kubemoot.runtime.refusals import Reason
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.metrics import FAILED, FINISHED, REFUSED, SimulatedOutcome
from kubemoot.sim.workload import CallSpec, Trace

__all__ = ["BASELINES", "BaselinePolicy", "Policy", "SimContext"]


@dataclass(slots=True)
class SimContext:
    """What a policy may see: the cards (by name), model sizes, the trace, a seeded RNG."""

    gpus: dict[str, EmulatedGpu]
    sizes: dict[str, int]
    trace: Trace
    rng: random.Random
    epoch: float = 0.0
    extras: dict[str, object] = field(default_factory=dict)


class Policy(ABC):
    """Serves calls; returns how each ended."""

    name: ClassVar[str]

    async def start(self, ctx: SimContext) -> None:  # noqa: B027 - optional hook
        """Prepare before the first call (bindings, runtime objects)."""

    @abstractmethod
    async def run_call(self, call: CallSpec, ctx: SimContext) -> SimulatedOutcome:
        """Serve one call: choose, wait, compute."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`start` made."""


class BaselinePolicy(Policy):
    """Route the preferred model to one card; the engine does the rest."""

    def __init__(self) -> None:
        self._feasible: dict[str, list[EmulatedGpu]] = {}

    async def start(self, ctx: SimContext) -> None:
        for model, size in ctx.sizes.items():
            self._feasible[model] = [g for g in ctx.gpus.values() if g.usable_mib >= size]

    @abstractmethod
    def choose(self, call: CallSpec, feasible: list[EmulatedGpu], ctx: SimContext) -> EmulatedGpu:
        """Pick a card among those that can hold the preferred model."""

    async def run_call(self, call: CallSpec, ctx: SimContext) -> SimulatedOutcome:
        feasible = self._feasible.get(call.model, [])
        if not feasible:
            return SimulatedOutcome(REFUSED, model=call.model, reason=Reason.MODEL_TOO_LARGE.value)
        gpu = self.choose(call, feasible, ctx)
        self.dispatched(gpu, +1)
        try:
            started = await gpu.serve(call.model, call.duration, prompt=call.prompt)
        except ProviderError as error:
            return SimulatedOutcome(FAILED, provider=gpu.name, model=call.model, reason=str(error))
        finally:
            self.dispatched(gpu, -1)
        return SimulatedOutcome(FINISHED, provider=gpu.name, model=call.model, started=started)

    def dispatched(self, gpu: EmulatedGpu, delta: int) -> None:
        """Hook for routers that count their own in-flight calls."""


class StaticPolicy(BaselinePolicy):
    name = "static"
    CONCURRENCY_FACTOR = 4
    LOCALITY_BONUS = 20.0

    def __init__(self) -> None:
        super().__init__()
        self._binding: dict[tuple[str, str], EmulatedGpu] = {}

    async def start(self, ctx: SimContext) -> None:
        await super().start(ctx)
        wanted: dict[tuple[str, str], str] = {}
        for discussion in ctx.trace.discussions:
            for turn in discussion.turns:
                for step in turn.steps:
                    for call in step.calls:
                        wanted.setdefault((call.agent, call.phase), call.model)
        bound_models: dict[str, set[str]] = defaultdict(set)
        agents: dict[str, int] = defaultdict(int)
        for key in sorted(wanted):
            model = wanted[key]
            feasible = self._feasible.get(model, [])
            if not feasible:
                continue
            roomy = [
                g for g in feasible
                if agents[g.name] + 1 <= g.max_parallel * self.CONCURRENCY_FACTOR
            ] or feasible  # with no card passing the gate, bind anyway (documented)

            def score(g: EmulatedGpu, model: str = model) -> tuple[float, str]:
                planned = sum(ctx.sizes[m] for m in bound_models[g.name] | {model})
                free = max(0, g.usable_mib - planned)
                value = 100.0 * free / g.usable_mib
                if model in bound_models[g.name]:
                    value += self.LOCALITY_BONUS
                return (-value, g.name)

            chosen = min(roomy, key=score)
            self._binding[key] = chosen
            bound_models[chosen.name].add(model)
            agents[chosen.name] += 1

    def choose(self, call: CallSpec, feasible: list[EmulatedGpu], ctx: SimContext) -> EmulatedGpu:
        return self._binding.get((call.agent, call.phase), feasible[0])


class RoundRobinPolicy(BaselinePolicy):
    name = "round-robin"

    def __init__(self) -> None:
        super().__init__()
        self._next: dict[str, int] = defaultdict(int)

    def choose(self, call: CallSpec, feasible: list[EmulatedGpu], ctx: SimContext) -> EmulatedGpu:
        index = self._next[call.model]
        self._next[call.model] = index + 1
        return feasible[index % len(feasible)]


class LeastBusyPolicy(BaselinePolicy):
    name = "least-busy"

    def __init__(self) -> None:
        super().__init__()
        self._in_flight: dict[str, int] = defaultdict(int)

    def dispatched(self, gpu: EmulatedGpu, delta: int) -> None:
        self._in_flight[gpu.name] += delta

    def choose(self, call: CallSpec, feasible: list[EmulatedGpu], ctx: SimContext) -> EmulatedGpu:
        return min(feasible, key=lambda g: (self._in_flight[g.name], g.name))


class RandomPolicy(BaselinePolicy):
    name = "random"

    def choose(self, call: CallSpec, feasible: list[EmulatedGpu], ctx: SimContext) -> EmulatedGpu:
        return feasible[ctx.rng.randrange(len(feasible))]


class HerdLikePolicy(BaselinePolicy):
    name = "herd-like"
    LOADED = 50.0
    FITS = 25.0
    PER_QUEUED = 10.0

    def choose(self, call: CallSpec, feasible: list[EmulatedGpu], ctx: SimContext) -> EmulatedGpu:
        size = ctx.sizes[call.model]

        def score(g: EmulatedGpu) -> tuple[float, str]:
            warm = g.is_warm(call.model)
            value = self.LOADED if warm else 0.0
            if warm or g.free_mib() >= size:
                value += self.FITS
            value -= self.PER_QUEUED * g.queue_depth()
            return (-value, g.name)

        return min(feasible, key=score)


BASELINES: dict[str, type[BaselinePolicy]] = {
    p.name: p
    for p in (StaticPolicy, RoundRobinPolicy, LeastBusyPolicy, RandomPolicy, HerdLikePolicy)
}
