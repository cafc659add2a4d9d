"""Every tunable of a Kubemoot process, with its default, in one frozen object.

The per-call runtime's defaults are DESIGN §5's. The process-level ones (how long a
first connection may take, how long a shutdown may take, the dashboard's limits) live
here too, so a deployment changes any of them the same way: every entry point calls
:meth:`RuntimeSettings.from_env`, which reads the ``KUBEMOOT_*`` variable named in
:data:`ENV_VARIABLES` for each field. This is the only home of each default (DESIGN
§10): a class or command-line option elsewhere that takes one of these numbers reads
its default from :data:`DEFAULTS`, never repeats it. The reserve is the one exception,
because the resource API (which imports nothing of ours) needs it too: its home is
:data:`kubemoot.api.provider.DEFAULT_RESERVE_MIB`.
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
    """Numbers a Kubemoot process uses; all times in seconds, sizes in MiB."""

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
    #: this window: the share of them the agent was selected for.
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
    #: How long one read of a provider's answer may take (a reply's first byte may wait
    #: behind a model load); the deadline above still bounds the call as a whole.
    provider_read_timeout_seconds: float = 120.0
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
    #: What evaluating one prompt token costs an engine (prefill) when its slot's cache
    #: does not hold it: about 2,500 tokens a second, a mid-sized model on one card.
    prefill_seconds_per_token: float = 0.0004
    #: How many of the cheapest options of one kind (warm copies, tightest cold fits) a
    #: placement lists and tries when it is not explaining itself: the rest could only
    #: win if all of these went away.
    copy_shortlist: int = 3

    # -- the process around the runtime ------------------------------------------------

    #: A command gives up on its first connection to the shared store after this long
    #: (it says where it connects and shows progress meanwhile).
    connect_wait_seconds: float = 30.0
    #: How often a long-running command checks that the shared store still answers, and
    #: how long one check may take before the store counts as lost.
    store_check_seconds: float = 2.0
    #: After SIGTERM or Ctrl-C, the time a command has to release its tickets and
    #: withdraw its intents before it exits anyway (Kubernetes waits 30 s by default).
    shutdown_grace_seconds: float = 10.0
    #: Of that grace, how long the runtime's own leftover work (ticket releases, call-log
    #: writes, preloads) may go on before it is cancelled, so the store still closes in
    #: time.
    straggler_grace_seconds: float = 2.0
    #: Seconds between two probes of every ModelProvider, and how long one may take.
    probe_interval_seconds: float = 30.0
    probe_timeout_seconds: float = 10.0
    #: Browsers the dashboard streams to at once; one more gets 503.
    dashboard_max_clients: int = 32
    #: The dashboard draws once per burst of writes this long, and at least this often.
    dashboard_coalesce_seconds: float = 0.2
    dashboard_refresh_seconds: float = 5.0
    #: A crew over NATS (``kubemoot agent``): how long the coordinator gathers members'
    #: answers to its roll call, how often a member working on a thread says it is alive,
    #: and how long a member may stay silent (its process gone) before the coordinator
    #: counts it as failed; the same time bounds the wait for members after a deadline.
    crew_roll_call_seconds: float = 0.5
    crew_heartbeat_seconds: float = 2.0
    crew_silence_seconds: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RuntimeSettings:
        """Defaults overridden by ``KUBEMOOT_*`` variables; a malformed one is an InputError.

        An empty variable counts as unset. The wait limit falls back to the synthesis
        deadline when only that is set: the spec ties the two together by default.
        """
        env = os.environ if env is None else env
        changes: dict[str, float | int] = {}
        for item in fields(cls):
            variable = ENV_VARIABLES[item.name]
            text = env.get(variable, "").strip()
            if not text and item.name == "gpu_wait_limit_seconds":
                variable = SYNTHESIS_TIMEOUT_ENV
                text = env.get(variable, "").strip()
            if text:
                changes[item.name] = _parse(variable, text, whole=item.type == "int")
        return replace(cls(), **changes)  # type: ignore[arg-type]

    def with_values(self, values: Mapping[str, float]) -> RuntimeSettings:
        """A copy with some fields changed (snake_case names)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(f"unknown runtime setting {unknown[0]!r}", field=unknown[0])
        return replace(self, **values)  # type: ignore[arg-type]


def _parse(name: str, text: str, *, whole: bool) -> float | int:
    try:
        value: float | int = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise InputError(f"must be {kind}, got {text!r}", field=name) from None
    if value < 0 or value != value:  # NaN compares unequal to itself
        raise InputError(f"must not be negative, got {text!r}", field=name)
    return value


#: The defaults, for code that takes one of these numbers as a parameter of its own.
DEFAULTS = RuntimeSettings()


#: The variable of each setting. Two keep the names the spec gives them; the rest are
#: ``KUBEMOOT_`` and the field's name in capitals.
_SPEC_NAMES = {
    "candidate_tolerance": "KUBEMOOT_MODEL_CANDIDATE_TOLERANCE",
    "gpu_wait_limit_seconds": "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS",
}
ENV_VARIABLES: dict[str, str] = {
    item.name: _SPEC_NAMES.get(item.name, f"KUBEMOOT_{item.name.upper()}")
    for item in fields(RuntimeSettings)
}
#: Read for the wait limit when its own variable is not set.
SYNTHESIS_TIMEOUT_ENV = "KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS"


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """Numbers of ``kubemoot gateway`` (DESIGN §9); times in seconds, sizes in bytes."""

    #: Where the gateway listens: loopback, one port above Ollama's 11434.
    listen: str = "127.0.0.1:11435"
    #: How long a busy call waits for a GPU when the client sets no
    #: ``X-Kubemoot-Wait-Budget`` (the agents' limit); a client may ask for up to
    #: ``max_wait_budget_seconds``.
    wait_limit_seconds: float = DEFAULTS.gpu_wait_limit_seconds
    max_wait_budget_seconds: float = 600.0
    #: The longest ``keep_alive`` a client may ask for (the scheduler decides eviction).
    max_keep_alive_seconds: float = 1800.0
    #: How often the gateway probes the providers it was given.
    probe_interval_seconds: float = 5.0
    #: Requests with a larger body are refused with 413 before they are parsed.
    max_body_bytes: int = 32 * 1024 * 1024
    #: How long the gateway waits for a provider's answer to one call, and for its
    #: answer to a listing (``/api/tags``, ``/api/ps``, ``/api/show``).
    call_timeout_seconds: float = 600.0
    listing_timeout_seconds: float = 10.0
    #: Connections the gateway keeps open to its providers, all together; more
    #: concurrent calls wait for a free connection.
    upstream_connections: int = 64
    #: On SIGTERM or Ctrl-C, how long replies still streaming may finish before their
    #: calls are cut (a cut call gets a 503 and its ticket back).
    drain_seconds: int = 2  # whole seconds: uvicorn takes an int
