"""Every tunable of the per-call runtime, with its default, in one frozen object.

The defaults are DESIGN §5's; :meth:`RuntimeSettings.from_env` reads the environment
variables the spec names so a deployment can change them without code. This is the
only home of each default (DESIGN §10): a class or command-line option elsewhere that
takes one of these numbers reads its default from :data:`DEFAULTS`, never repeats it.
The reserve is the one exception, because the resource API (which imports nothing of
ours) needs it too: its home is :data:`kubemoot.api.provider.DEFAULT_RESERVE_MIB`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from kubemoot.api.errors import InputError
from kubemoot.api.provider import DEFAULT_RESERVE_MIB

MIB_PER_GIB = 1024


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Numbers the per-call runtime uses; all times in seconds, sizes in MiB."""

    #: How fast a model loads (and an unloaded one reloads) — about 1 GiB/s on Ollama.
    load_rate_mibps: float = 1024.0
    #: What one unload costs.
    unload_seconds: float = 1.0
    #: Call latency assumed for an endpoint before any call there was observed.
    default_latency_seconds: float = 30.0
    #: Weight of the newest observation in the per-endpoint latency average.
    latency_ema_alpha: float = 0.3
    #: VRAM kept back per provider (CUDA context, fragmentation) when a provider
    #: does not say its own.
    reserve_mib: int = DEFAULT_RESERVE_MIB
    #: Candidates whose score is at least preferred − tolerance may be used warm.
    candidate_tolerance: float = 10.0
    #: How much a queue's price counts the other calls expected for the same model
    #: while it waits (they wait too; a second copy would shorten their waits as well).
    #: 0 prices a queue by this call's own wait alone, DESIGN §5's floor.
    queue_demand_weight: float = 1.0
    #: A ticket not released by its holder is reclaimed after this long.
    ticket_ttl_seconds: float = 180.0
    #: A waiter or an intent on the demand board that its agent stops renewing lapses
    #: after this long.
    demand_wait_ttl_seconds: float = 180.0
    demand_intent_ttl_seconds: float = 180.0
    #: Recent use of a model decays with this time constant (e^(−age/window)).
    demand_use_window_seconds: float = 300.0
    #: How long a read of provider state and tickets is reused (absorbs fan-out bursts).
    state_cache_seconds: float = 0.2
    #: How often the list of providers is re-read (a listing costs more than reads of
    #: known keys on a networked store); new providers appear within this time.
    discovery_seconds: float = 5.0
    #: How long a read of the demand board is reused; demand only orders victims.
    demand_cache_seconds: float = 1.0
    #: A plan held from selection that no call took is released after this long.
    held_plan_ttl_seconds: float = 180.0
    #: An agent's selection frequency (the demand forecast) counts the threads seen in
    #: this window: the share of them the agent was selected for; a selection written
    #: to the demand board lives as long.
    selection_window_seconds: float = 3600.0
    #: Safety net for a busy call waiting on capacity changes.
    gpu_wait_limit_seconds: float = 90.0
    #: KV-cache bytes per token of context, for the slab estimate of a never-loaded model.
    kv_bytes_per_token: int = 131072
    #: Context and parallel slots assumed by the slab estimate when a provider says none.
    estimate_num_ctx: int = 4096
    estimate_num_parallel: int = 1
    #: How long one provider call (chat, preload, unload, probe) may take in all, every
    #: read and retry included: a per-read timeout alone never ends a call to a server
    #: that drips a byte now and then.
    provider_call_deadline_seconds: float = 300.0
    #: Consecutive failures that open a provider's circuit, and how long it stays open.
    circuit_failure_threshold: int = 3
    circuit_cooldown_seconds: float = 30.0
    #: Compare-and-set attempts of one claim before giving up.
    claim_attempts: int = 8
    #: A claimer refused for memory keeps its place in the provider's line this long
    #: after its last try (claimers across processes are served first come first).
    claim_line_seconds: float = 5.0
    #: Prompt size assumed when a call is planned before its prompt exists.
    assumed_prompt_tokens: int = 2048
    #: How many of the cheapest options of one kind (warm copies, tightest cold fits) a
    #: placement lists and tries when it is not explaining itself: the rest could only
    #: win if all of these went away.
    copy_shortlist: int = 3

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RuntimeSettings:
        """Defaults overridden by ``KUBEMOOT_*`` variables; a malformed one is an InputError."""
        env = os.environ if env is None else env
        changes: dict[str, float] = {}
        tolerance = env.get("KUBEMOOT_MODEL_CANDIDATE_TOLERANCE")
        if tolerance is not None:
            changes["candidate_tolerance"] = _number(
                "KUBEMOOT_MODEL_CANDIDATE_TOLERANCE", tolerance
            )
        limit = env.get("KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS")
        synthesis = env.get("KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS")
        if limit is not None:
            changes["gpu_wait_limit_seconds"] = _number(
                "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS", limit
            )
        elif synthesis is not None:
            # The spec ties the wait's safety net to the synthesis deadline by default.
            changes["gpu_wait_limit_seconds"] = _number(
                "KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS", synthesis
            )
        return replace(cls(), **changes)  # type: ignore[arg-type]

    def with_values(self, values: Mapping[str, float]) -> RuntimeSettings:
        """A copy with some fields changed (snake_case names)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(f"unknown runtime setting {unknown[0]!r}", field=unknown[0])
        return replace(self, **values)  # type: ignore[arg-type]


#: The defaults, for code that takes one of these numbers as a parameter of its own.
DEFAULTS = RuntimeSettings()


def _number(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{name} must be a number, got {text!r}", field=name) from None
    if value < 0:
        raise InputError(f"{name} must not be negative, got {text!r}", field=name)
    return value
