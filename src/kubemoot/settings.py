"""Every tunable of a Kubemoot process, with its default: one :class:`Settings`.

A process reads its settings once, where it is assembled: the entry point (a CLI
command) calls :meth:`Settings.from_env`, which reads the ``KUBEMOOT_*`` variable named
in :data:`ENV_VARIABLES` for each numeric field, and hands the sections down as values.
Nothing below an entry point reads the environment (DESIGN §10), so a test, the
simulator or a second process in the same interpreter builds the same objects from
plain values.

The sections: ``runtime`` (the per-call runtime, DESIGN §5), ``process`` (connecting,
checking the store, shutting down), ``crew`` (agents over NATS), ``dashboard``,
``gateway`` (set by its flags and file, not by variables) and ``nats`` (how to reach
the shared store, ``KUBEMOOT_NATS_*``). This is the only home of each default: a class
or command-line option elsewhere that takes one of these numbers reads its default from
here, never repeats it. The module imports nothing else of ours, so every layer (the
resource API included, for the reserve) may import it.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

__all__ = [
    "DEFAULTS", "DEFAULT_RESERVE_MIB", "ENV_VARIABLES", "MIB_PER_GIB", "CrewSettings",
    "DashboardSettings", "GatewaySettings", "NatsSettings", "ProcessSettings", "RuntimeSettings",
    "SettingError", "Settings",
]

MIB_PER_GIB = 1024
#: VRAM kept back per provider (CUDA context, fragmentation) when it does not say its
#: own; the resource API's default for ``reserveMiB`` too.
DEFAULT_RESERVE_MIB = 1024


class SettingError(ValueError):
    """A ``KUBEMOOT_*`` variable (or a named setting) with a value that cannot be used.

    It says which variable, like :class:`kubemoot.api.errors.InputError` (the CLI shows
    both as one line and exits 2); it is its own class because this module imports
    nothing of ours.
    """

    def __init__(self, message: str, *, field: str) -> None:
        self.message = message
        self.field = field
        super().__init__(self.describe())

    def describe(self) -> str:
        return f"field {self.field}: {self.message}"


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Numbers of the per-call runtime (DESIGN §5); all times in seconds, sizes in MiB."""

    #: How fast a model loads (and an unloaded one reloads) — about 1 GiB/s on Ollama.
    load_rate_mibps: float = 1024.0
    #: What one unload costs.
    unload_seconds: float = 1.0
    #: Call latency assumed for an endpoint before any call there was observed.
    default_latency_seconds: float = 30.0
    #: Weight of the newest observation in the per-endpoint latency average.
    latency_ema_alpha: float = 0.3
    #: VRAM kept back per provider when a provider does not say its own.
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
    #: How long a claim or release that lost a race stays announced for other
    #: processes' writers to apply (its claimer keeps trying on its own meanwhile);
    #: 0 announces nothing: every claim races on its own, and no watch is opened.
    claim_request_seconds: float = 0.5
    #: Prompt size assumed when a call is planned before its prompt exists.
    assumed_prompt_tokens: int = 2048
    #: What evaluating one prompt token costs an engine (prefill) when its slot's cache
    #: does not hold it: about 2,500 tokens a second, a mid-sized model on one card.
    prefill_seconds_per_token: float = 0.0004
    #: How many of the cheapest options of one kind (warm copies, tightest cold fits) a
    #: placement lists and tries when it is not explaining itself: the rest could only
    #: win if all of these went away.
    copy_shortlist: int = 3
    #: How long the runtime asks an engine to keep a copy after its last call. Its own
    #: unload plans make room whenever a load needs it, so a copy need not expire on
    #: Ollama's 5-minute default only to be loaded again minutes later.
    engine_keep_alive_seconds: float = 1800.0

    #: Seconds between two probes of every provider by the prober of a cluster (the
    #: operator's): a call waiting while nothing is in flight expects news this often.
    #: The gateway, which probes its own providers, has its own interval
    #: (:attr:`GatewaySettings.provider_probe_seconds`).
    probe_interval_seconds: float = 30.0
    #: How long one probe may take.
    probe_timeout_seconds: float = 10.0

    def with_values(self, values: Mapping[str, float]) -> RuntimeSettings:
        """A copy with some fields changed (snake_case names)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SettingError("no such runtime setting", field=unknown[0])
        return replace(self, **values)  # type: ignore[arg-type]


def _parse(name: str, text: str, *, whole: bool) -> float | int:
    try:
        value: float | int = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise SettingError(f"must be {kind}, got {text!r}", field=name) from None
    if value < 0 or value != value:  # NaN compares unequal to itself
        raise SettingError(f"must not be negative, got {text!r}", field=name)
    return value


#: The defaults, for code that takes one of these numbers as a parameter of its own.
DEFAULTS = RuntimeSettings()


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """How a long-running command connects, watches its store and shuts down."""

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


@dataclass(frozen=True, slots=True)
class CrewSettings:
    """A crew over NATS (``kubemoot agent``, ``kubemoot ask``)."""

    #: How long the coordinator gathers members' answers to its roll call.
    roll_call_seconds: float = 0.5
    #: How often a member working on a thread says it is alive.
    heartbeat_seconds: float = 2.0
    #: How long a member may stay silent (its process gone) before the coordinator counts
    #: it as failed; the same time bounds the wait for members after a deadline.
    silence_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    """Tunables of the dashboard page."""

    #: Not read from a variable of its own: the process's store check.
    FROM_OTHER_SECTIONS: ClassVar[frozenset[str]] = frozenset({"store_check_seconds"})

    #: Many writes land together (a claim, a probe, a call log): draw once for them.
    coalesce_seconds: float = 0.2
    #: Ages and expiries move without any write; redraw now and then anyway.
    refresh_seconds: float = 5.0
    #: Event streams (browsers) served at once; one more gets 503.
    max_clients: int = 32
    #: How often the store is asked whether it still answers (0: never).
    store_check_seconds: float = ProcessSettings().store_check_seconds
    #: Host names accepted in the ``Host`` header besides loopback and IP addresses.
    allowed_hosts: tuple[str, ...] = ()

    def allowing(self, hosts: Sequence[str]) -> DashboardSettings:
        """A copy that also accepts ``hosts`` (blank names dropped, case folded)."""
        extra = tuple(h.strip().lower() for h in hosts if h.strip())
        return replace(self, allowed_hosts=(*self.allowed_hosts, *extra))


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
    #: How often the gateway probes the providers it was given: it has no operator
    #: probing for it, so it looks more often than a cluster's prober
    #: (:attr:`RuntimeSettings.probe_interval_seconds`).
    provider_probe_seconds: float = 5.0
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
    #: Requests served at once (probes, ``/metrics`` and ``/`` aside); one more is
    #: answered 503 with ``Retry-After`` at once rather than held.
    max_concurrent_requests: int = 1024
    #: Request-body bytes held in memory by all requests together; a body that would
    #: pass it is answered 503 (each body alone is bounded by ``max_body_bytes``).
    max_buffered_bytes: int = 96 * 1024 * 1024
    #: A connection must send a request's whole header within this time, and an idle
    #: kept-alive connection is closed after ``idle_timeout_seconds`` (slow senders hold
    #: sockets and memory otherwise).
    header_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 5.0
    #: Browser origins allowed besides loopback ones (``--allow-origin``, ``*`` for any)
    #: and host names allowed in ``Host`` besides loopback, IP addresses and the bound
    #: name (``--allow-host``).
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    #: Consecutive calls a provider failed (5xx) after which ``/readyz`` says the
    #: inference path is broken; one call that succeeds makes it ready again.
    unready_after_failures: int = 3


@dataclass(frozen=True, slots=True)
class NatsSettings:
    """How to reach NATS (the shared store). Every field has an environment variable
    (see :meth:`from_env`); a command's ``--nats-*`` flags win over them."""

    servers: list[str] = field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    user: str | None = None
    password: str | None = None
    token: str | None = None
    credentials_file: str | None = None  # a .creds file (JWT + nkey seed)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    name: str = "kubemoot"
    connect_timeout: float = 2.0
    # rounds over the server list, at connect and after a disconnect; -1 (or 0) never stops
    max_reconnect_attempts: int = 120
    reconnect_wait: float = 0.5
    request_timeout: float = 5.0  # JetStream API calls and publish acknowledgements
    # copies of each bucket a JetStream cluster keeps (1, 3 or 5); only used on creation
    replicas: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NatsSettings:
        """Read ``KUBEMOOT_NATS_*``; ``KUBEMOOT_NATS_URL`` may list servers by commas."""
        env = os.environ if environ is None else environ
        urls = [u.strip() for u in env.get("KUBEMOOT_NATS_URL", "").split(",") if u.strip()]

        def opt(name: str) -> str | None:
            value = env.get(f"KUBEMOOT_NATS_{name}", "").strip()
            return value or None

        return cls(
            servers=urls or ["nats://127.0.0.1:4222"],
            user=opt("USER"),
            password=opt("PASSWORD"),
            token=opt("TOKEN"),
            credentials_file=opt("CREDS"),
            tls_ca=opt("TLS_CA"),
            tls_cert=opt("TLS_CERT"),
            tls_key=opt("TLS_KEY"),
            replicas=_replicas(opt("REPLICAS")),
        )

    def tls_context(self) -> ssl.SSLContext | None:
        """A client TLS context when any TLS file is configured."""
        if not (self.tls_ca or self.tls_cert or self.tls_key):
            return None
        context = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context


def _replicas(text: str | None) -> int:
    """``KUBEMOOT_NATS_REPLICAS``: 1 (default), 3 or 5, as JetStream clusters take them."""
    if text is None:
        return 1
    if text not in ("1", "3", "5"):
        raise SettingError(f'must be 1, 3 or 5, got "{text}"', field="KUBEMOOT_NATS_REPLICAS")
    return int(text)


_S = TypeVar("_S", RuntimeSettings, ProcessSettings, CrewSettings, DashboardSettings)

#: Each section read from the environment, and what its variables start with.
_SECTIONS: dict[str, tuple[type[Any], str]] = {
    "runtime": (RuntimeSettings, "KUBEMOOT_"),
    "process": (ProcessSettings, "KUBEMOOT_"),
    "crew": (CrewSettings, "KUBEMOOT_CREW_"),
    "dashboard": (DashboardSettings, "KUBEMOOT_DASHBOARD_"),
}
#: Two variables keep the names the spec gives them.
_SPEC_NAMES = {
    "runtime.candidate_tolerance": "KUBEMOOT_MODEL_CANDIDATE_TOLERANCE",
    "runtime.gpu_wait_limit_seconds": "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS",
}
#: Read for the wait limit when its own variable is not set: the spec ties the two.
SYNTHESIS_TIMEOUT_ENV = "KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS"


def _numeric(section: type[Any]) -> list[str]:
    skip: frozenset[str] = getattr(section, "FROM_OTHER_SECTIONS", frozenset())
    return [f.name for f in fields(section)
            if f.type in ("int", "float") and f.name not in skip]


#: The variable of each setting read from the environment, by ``section.field``.
ENV_VARIABLES: dict[str, str] = {
    f"{name}.{item}": _SPEC_NAMES.get(f"{name}.{item}", f"{prefix}{item.upper()}")
    for name, (section, prefix) in _SECTIONS.items()
    for item in _numeric(section)
}


def _read(section: type[_S], name: str, env: Mapping[str, str]) -> _S:
    changes: dict[str, float | int] = {}
    for item in _numeric(section):
        key = f"{name}.{item}"
        variable = ENV_VARIABLES[key]
        text = env.get(variable, "").strip()
        if not text and key == "runtime.gpu_wait_limit_seconds":
            variable = SYNTHESIS_TIMEOUT_ENV
            text = env.get(variable, "").strip()
        if text:
            whole = next(f for f in fields(section) if f.name == item).type == "int"
            changes[item] = _parse(variable, text, whole=whole)
    return replace(section(), **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Settings:
    """All of a process's settings, by section; built once, by its entry point."""

    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    process: ProcessSettings = field(default_factory=ProcessSettings)
    crew: CrewSettings = field(default_factory=CrewSettings)
    dashboard: DashboardSettings = field(default_factory=DashboardSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    nats: NatsSettings = field(default_factory=NatsSettings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Defaults overridden by ``KUBEMOOT_*`` variables; a malformed one is a
        :class:`SettingError` naming it. An empty variable counts as unset; the wait
        limit falls back to the synthesis deadline when only that is set.

        Only an entry point calls this without ``env`` (DESIGN §10).
        """
        env = os.environ if env is None else env
        process = _read(ProcessSettings, "process", env)
        dashboard = replace(_read(DashboardSettings, "dashboard", env),
                            store_check_seconds=process.store_check_seconds)
        runtime = _read(RuntimeSettings, "runtime", env)
        return cls(runtime=runtime, process=process, crew=_read(CrewSettings, "crew", env),
                   dashboard=dashboard, nats=NatsSettings.from_env(env))
