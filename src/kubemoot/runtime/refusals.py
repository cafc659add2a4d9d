"""Why a call found no option: too large, prompt too large, or just busy.

Waiting only helps when the GPUs are busy. A model no card can hold, or a prompt no
provider's context can take, is reported at once so the agent can stand aside with
an honest reason instead of waiting out its limit.

* **model-too-large** — every provider has published its VRAM total and none has
  usable ≥ occupancy(preferred). An unknown total never proves a model too large.
* **prompt-too-large** — some provider could hold an acceptable model, but the
  context of every such (provider, model) pair is known and smaller than the prompt.
  An unknown context admits the prompt.
* **model-unknown** — no acceptable model is known anywhere: no Model resource
  declares it, no provider lists it on disk, runs it, loads it or has ever reported
  its footprint. That is a misspelt name, and waiting would only hide it. Every
  provider must be ready to say so: a provider that is down lists nothing.
* otherwise **gpu-busy** — the call waits for capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from kubemoot.gates.results import Verdict
from kubemoot.runtime import filters
from kubemoot.runtime.cost import CostModel
from kubemoot.runtime.snapshot import FleetSnapshot, ProviderSnapshot


class Reason(StrEnum):
    """``metadata.reason`` of a call that was not placed."""

    GPU_BUSY = "gpu-busy"
    MODEL_TOO_LARGE = "model-too-large"
    PROMPT_TOO_LARGE = "prompt-too-large"
    MODEL_UNKNOWN = "model-unknown"

    @property
    def final(self) -> bool:
        """Whether waiting cannot help (the agent stands aside at once)."""
        return self is not Reason.GPU_BUSY


def classify(
    fleet: FleetSnapshot,
    cost: CostModel,
    *,
    preferred: str,
    acceptable: Sequence[str],
    prompt_tokens: int | None,
) -> Reason:
    """Classify a placement that came back empty."""
    if all(model_unknown(fleet, cost, model) for model in acceptable):
        return Reason.MODEL_UNKNOWN
    if model_too_large(fleet, cost, preferred):
        return Reason.MODEL_TOO_LARGE
    if prompt_tokens is not None and prompt_too_large(fleet, cost, acceptable, prompt_tokens):
        return Reason.PROMPT_TOO_LARGE
    return Reason.GPU_BUSY


def model_unknown(fleet: FleetSnapshot, cost: CostModel, model: str) -> bool:
    """Whether nothing in the fleet or the declarations knows ``model`` at all."""
    if not fleet.providers or any(not p.state.ready for p in fleet.providers):
        return False  # no answer from some provider: it might hold the model
    if cost.occupancy(model) is not None:
        return False  # declared, observed, claimed or listed on some provider's disk
    return not any(p.has_copy(model) for p in fleet.providers)


def model_too_large(fleet: FleetSnapshot, cost: CostModel, model: str) -> bool:
    occupancy = cost.occupancy(model)
    if occupancy is None or not fleet.providers:
        return False  # nothing proves it: we cannot tell too large from busy
    for p in fleet.providers:
        usable = p.usable_mib
        if usable is None or usable >= occupancy:
            return False
    return True


def _could_hold(p: ProviderSnapshot, cost: CostModel, model: str) -> bool:
    if p.is_resident(model) or p.loading_tickets(model):
        return True
    usable, occupancy = p.usable_mib, cost.occupancy(model)
    return usable is None or occupancy is None or occupancy <= usable


def prompt_too_large(
    fleet: FleetSnapshot, cost: CostModel, acceptable: Sequence[str], prompt_tokens: int
) -> bool:
    some_could_hold = False
    for model in acceptable:
        for p in fleet.providers:
            if not _could_hold(p, cost, model):
                continue
            some_could_hold = True
            if filters.context_gate(p, model, prompt_tokens).result is not Verdict.FAIL:
                return False
    return some_could_hold
