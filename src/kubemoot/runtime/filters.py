"""The hard filters of a per-call placement, as typed gate results.

Per (provider, model) pair:

* a **warm** copy (resident, or being loaded by another call) is feasible when the
  provider is ready, its circuit is closed, no ticket plans to unload that copy, and
  the context holds the prompt;
* a **cold** load is feasible when the provider is ready, its circuit is closed, it
  has the model on disk (when it publishes what it has at all), usable ≥ occupancy,
  occupancy + resident ≤ usable, and the context holds the prompt.

The readiness gate says STALE for a provider whose state is older than its freshness
limit (:mod:`kubemoot.runtime.freshness`): not known to be down, but no evidence either.
The context gate says UNKNOWN when nobody published a context, and marks that result
``admits_unknown``: an unknown context admits the call (the spec: it never refuses
one). Which standing a list of results gives is the gates package's one rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubemoot.gates.results import GateResult, Standing, standing
from kubemoot.runtime.freshness import StaleState
from kubemoot.runtime.snapshot import ProviderSnapshot

READY = "ready"
CIRCUIT = "circuit"
CONTEXT = "context"
WARM = "warm"
VRAM = "vram"
FIT = "fit"
ON_DISK = "on-disk"

# Read per option: a module global, not through the class (EnumType.__getattr__'s hook
# on Python 3.11 costs about 850 instructions a read).
_FEASIBLE = Standing.FEASIBLE


def feasible(results: Sequence[GateResult]) -> bool:
    """Do these results leave the option feasible (by the gates' standing rule)?"""
    return standing(results) is _FEASIBLE


def ready_gate(p: ProviderSnapshot) -> GateResult:
    if p.state.ready:
        return GateResult.pass_(READY, "provider is ready")
    state = p.state
    if isinstance(state, StaleState):  # not known to be down: nobody has looked lately
        return GateResult.stale(READY, state.reason or "provider state is stale",
                                ageSeconds=round(state.stale_seconds, 3),
                                maxAgeSeconds=round(state.max_age_seconds, 3))
    return GateResult.fail(READY, p.state.reason or "provider is not ready", ready=False)


def circuit_gate(p: ProviderSnapshot) -> GateResult:
    if p.circuit_open:
        return GateResult.fail(CIRCUIT, "circuit open after repeated call failures")
    return GateResult.pass_(CIRCUIT, "circuit closed")


def context_gate(p: ProviderSnapshot, model: str, prompt_tokens: int | None) -> GateResult:
    """Does the provider's context for this model hold the prompt?"""
    context = p.context_for(model)
    if prompt_tokens is None:
        return GateResult.pass_(CONTEXT, "no prompt size to check", contextLength=context)
    if context is None:
        return GateResult.unknown(
            CONTEXT, "context not published; an unknown context admits the call",
            admits=True, promptTokens=prompt_tokens,
        )
    if prompt_tokens <= context:
        return GateResult.pass_(
            CONTEXT, "context holds the prompt", contextLength=context, promptTokens=prompt_tokens
        )
    return GateResult.fail(
        CONTEXT,
        f"prompt of {prompt_tokens} tokens exceeds the context of {context}",
        contextLength=context,
        promptTokens=prompt_tokens,
    )


def disk_gate(p: ProviderSnapshot, model: str) -> GateResult:
    """Can the provider load ``model`` at all: does it have the model on disk?

    An engine answers "model not found" to a load of a model it does not have, so a
    load placed there is a 404 for a model other servers list. A provider that
    publishes no disk list (a state written by hand, the simulator) is not judged.
    """
    disk = p.state.disk_sizes_mib
    if not disk:
        return GateResult.pass_(ON_DISK, "provider publishes no disk list; not judged")
    if model in disk:
        return GateResult.pass_(ON_DISK, "provider has the model on disk", diskMiB=disk[model])
    return GateResult.fail(ON_DISK, "provider does not have the model on disk")


def warm_ok(p: ProviderSnapshot, model: str, prompt_tokens: int | None) -> bool:
    """``feasible(warm_gates(...))`` without building the evidence (the hot path)."""
    if not p.state.ready or p.circuit_open or model in p.planned_victims():
        return False
    if prompt_tokens is None:
        return True
    context = p.context_for(model)
    return context is None or prompt_tokens <= context


def warm_gates(p: ProviderSnapshot, model: str, prompt_tokens: int | None) -> list[GateResult]:
    """Gates of using the warm (resident or loading) copy of ``model`` on ``p``."""
    if model in p.planned_victims():
        # A copy another call is about to unload is not a copy to share.
        warm = GateResult.fail(WARM, "copy is planned for unload by another ticket")
    else:
        warm = GateResult.pass_(WARM, "copy is resident or loading")
    return [ready_gate(p), circuit_gate(p), warm, context_gate(p, model, prompt_tokens)]


def cold_gates(
    p: ProviderSnapshot,
    model: str,
    *,
    occupancy: int | None,
    usable: int | None,
    resident: int,
    prompt_tokens: int | None,
) -> list[GateResult]:
    """Gates of loading ``model`` onto free room on ``p``."""
    results = [ready_gate(p), circuit_gate(p), disk_gate(p, model)]
    if usable is None:
        results.append(GateResult.unknown(VRAM, "provider has not published its VRAM total"))
    elif occupancy is None:
        results.append(GateResult.unknown(VRAM, f"occupancy of {model} is not known"))
    elif occupancy > usable:
        results.append(
            GateResult.fail(
                VRAM, "model is larger than the provider's usable VRAM",
                occupancyMiB=occupancy, usableMiB=usable,
            )
        )
    else:
        results.append(
            GateResult.pass_(VRAM, "usable VRAM can hold the model",
                             occupancyMiB=occupancy, usableMiB=usable)
        )
        if occupancy + resident <= usable:
            results.append(
                GateResult.pass_(FIT, "model fits beside the residents",
                                 occupancyMiB=occupancy, residentMiB=resident, usableMiB=usable)
            )
        else:
            results.append(
                GateResult.fail(FIT, "not enough free VRAM beside the residents",
                                occupancyMiB=occupancy, residentMiB=resident, usableMiB=usable)
            )
    results.append(context_gate(p, model, prompt_tokens))
    return results
