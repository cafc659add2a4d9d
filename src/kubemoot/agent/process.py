"""One Agent as a process: what its Deployment's env says, and the process's life.

The operator writes the binding into the Deployment's env (``KUBEMOOT_MODEL_MODEL``,
``KUBEMOOT_MODEL_CANDIDATES_MULLING``, the triage model, the bound endpoints, the
declared sizes of the listed models in ``KUBEMOOT_MODEL_SIZES_MIB``, or a phase's
``…_UNSCHEDULABLE_REASON`` instead of its binding) and the Agent's tools and prompt refs
(:mod:`kubemoot.agent.spec_env`); the crew's chart adds who the agent is
(``KUBEMOOT_AGENT_NAME``, ``KUBEMOOT_AGENT_NAMESPACE`` from the downward API,
``KUBEMOOT_CREW``, ``KUBEMOOT_AGENT_ROLE``). :func:`profile_from_env` turns that into
the engine's :class:`~kubemoot.agent.discussion.AgentProfile`, and :func:`sizes_from_env`
turns the sizes into the runtime's declarations; a malformed variable is an
:class:`~kubemoot.api.errors.InputError` naming it.

:func:`serve_agent` runs the agent: the per-call runtime over the shared state, a
:class:`ProviderDirectory` of the providers the state bucket lists (the planner unloads
and preloads through them, and a finished call re-probes its provider so the next
placement sees the copy it left resident), and the agent's part in its crew —
:class:`~kubemoot.agent.remote.CrewCoordinator` for the coordinator,
:class:`~kubemoot.agent.remote.CrewMember` for everyone else. Every discovery tick it
reads the shared state again: the providers (probing its bound endpoints itself while
there are none, :mod:`kubemoot.agent.direct`), the declared sizes the operator
publishes, and the prompt files; the profile, static targets included, follows.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubemoot.agent.crew import COORDINATOR_ROLE
from kubemoot.agent.direct import DirectProbe, is_direct
from kubemoot.agent.discussion import AgentProfile
from kubemoot.agent.pool import ClientFactory
from kubemoot.agent.remote import CrewCoordinator, CrewMember, CrewRef
from kubemoot.agent.runtime import CallRecord, StaticTarget
from kubemoot.agent.spec_env import enabled_tools, json_list, prompt_source
from kubemoot.agent.toolloop import Tool
from kubemoot.agent.wiring import build_stack
from kubemoot.api import Phase
from kubemoot.api.bounds import MAX_MIB
from kubemoot.api.errors import InputError
from kubemoot.clock import Clock
from kubemoot.providers.prober import Prober, Publish, publish_to_kv
from kubemoot.providers.protocol import ProviderClient
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import Settings
from kubemoot.store.bus import Bus
from kubemoot.store.declared import MODEL_SIZES_BUCKET, read_declared_sizes
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, ProviderState
from kubemoot.store.protocol import KV, Bucket, StoreError

__all__ = [
    "ENV_AGENT_NAME",
    "ENV_AGENT_NAMESPACE",
    "ENV_AGENT_ROLE",
    "ENV_CREW",
    "ENV_MODEL_SIZES",
    "ENV_UNSCHEDULABLE",
    "AfterCall",
    "AgentIdentity",
    "ProviderDirectory",
    "profile_from_env",
    "serve_agent",
    "sizes_from_env",
]

log = logging.getLogger(__name__)

ENV_AGENT_NAME = "KUBEMOOT_AGENT_NAME"
ENV_AGENT_NAMESPACE = "KUBEMOOT_AGENT_NAMESPACE"
ENV_CREW = "KUBEMOOT_CREW"
ENV_AGENT_ROLE = "KUBEMOOT_AGENT_ROLE"
# What the operator templates (kubemoot.scheduling.bind names the same variables; the
# agent package does not import the control plane).
ENV_MODEL = "KUBEMOOT_MODEL_MODEL"
ENV_MODEL_ENDPOINT = "KUBEMOOT_MODEL_ENDPOINT"
ENV_TRIAGE_MODEL_ID = "KUBEMOOT_TRIAGE_MODEL_MODEL_ID"
ENV_TRIAGE_ENDPOINT = "KUBEMOOT_TRIAGE_MODEL_ENDPOINT"
ENV_CANDIDATES_MULLING = "KUBEMOOT_MODEL_CANDIDATES_MULLING"
ENV_CANDIDATES_TRIAGE = "KUBEMOOT_MODEL_CANDIDATES_TRIAGE"
ENV_MODEL_SIZES = "KUBEMOOT_MODEL_SIZES_MIB"
#: Set by the operator, instead of the phase's binding, while the phase is UNSCHEDULABLE:
#: the FailedScheduling message. The agent makes no call in that phase.
ENV_UNSCHEDULABLE: dict[str, str] = {
    Phase.MULLING: "KUBEMOOT_MODEL_UNSCHEDULABLE_REASON",
    Phase.TRIAGE: "KUBEMOOT_TRIAGE_MODEL_UNSCHEDULABLE_REASON",
}
#: Declared Model sizes the operator publishes: ``<model token>`` → ``{model, vramMiB}``.

MAX_CANDIDATES = 256  # far more than a Model bundle holds; bounds a malformed variable


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """Who the process is: the Agent's name and namespace, its crew, its role."""

    name: str
    namespace: str
    crew: CrewRef
    role: str = "member"

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def coordinates(self) -> bool:
        return self.role == COORDINATOR_ROLE


def _candidates(env: Mapping[str, str], variable: str) -> tuple[CandidateModel, ...]:
    items = json_list(env, variable, example='[{"model":"qwen3:14b","score":70}]',
                      limit=MAX_CANDIDATES, what="candidates")
    out: list[CandidateModel] = []
    for index, item in enumerate(items):
        where = f"{variable}[{index}]"
        if not isinstance(item, dict):
            raise InputError('must be an object like {"model":"qwen3:14b","score":70}',
                             field=where)
        model, score = item.get("model"), item.get("score", 0)
        if not isinstance(model, str) or not model.strip():
            raise InputError("needs a model name", field=f"{where}.model")
        if isinstance(score, bool) or not isinstance(score, int | float) or score != score \
                or abs(score) == float("inf"):
            raise InputError(f"must be a finite number, got {score!r}", field=f"{where}.score")
        out.append(CandidateModel(model.strip(), float(score)))
    return tuple(out)


def sizes_from_env(env: Mapping[str, str]) -> dict[str, int]:
    """The declared ``vramMib`` of each listed model, from ``KUBEMOOT_MODEL_SIZES_MIB``.

    The runtime sizes a model no provider has loaded yet by these, as the demo and the
    gateway do from their Model resources; unset or empty declares nothing.
    """
    text = env.get(ENV_MODEL_SIZES, "").strip()
    if not text:
        return {}
    try:
        items = json.loads(text)
    except ValueError as error:
        raise InputError(f"is not JSON: {error}", field=ENV_MODEL_SIZES) from None
    if not isinstance(items, dict):
        raise InputError('must be a JSON object like {"qwen3:8b":5120}', field=ENV_MODEL_SIZES)
    if len(items) > MAX_CANDIDATES:
        raise InputError(f"declares {len(items)} models; at most {MAX_CANDIDATES}",
                         field=ENV_MODEL_SIZES)
    sizes: dict[str, int] = {}
    for model, mib in items.items():
        if not model.strip():
            raise InputError("names a model with an empty name", field=ENV_MODEL_SIZES)
        if isinstance(mib, bool) or not isinstance(mib, int) or not 0 <= mib <= MAX_MIB:
            raise InputError(f"must be whole MiB from 0 to {MAX_MIB}, got {mib!r}",
                             field=f"{ENV_MODEL_SIZES}[{model!r}]")
        sizes[model.strip()] = mib
    return sizes


def unschedulable_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """Phase → FailedScheduling message, for the phases the operator could not bind."""
    found: dict[str, str] = {}
    for phase, variable in ENV_UNSCHEDULABLE.items():
        reason = env.get(variable, "").strip()
        if reason:
            found[str(phase)] = reason
    return found


def profile_from_env(
    env: Mapping[str, str],
    identity: AgentIdentity,
    *,
    providers: Mapping[str, ProviderState] | None = None,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
) -> AgentProfile:
    """The engine's profile of this agent from its Deployment's env.

    ``providers`` (by name) resolves the bound endpoints to providers, for the static
    fallback of calls that cannot wait; an endpoint no provider serves has none, unless
    there is no provider state at all (then the endpoint is all there is). ``tools``
    and ``system_prompt`` come from the Agent's spec (:mod:`kubemoot.agent.spec_env`).
    A phase with an unschedulable reason has no candidates: it makes no call.
    """
    unschedulable = unschedulable_from_env(env)
    if Phase.MULLING in unschedulable:
        env = {k: v for k, v in env.items() if k not in (ENV_MODEL, ENV_MODEL_ENDPOINT,
                                                         ENV_CANDIDATES_MULLING)}
    if Phase.TRIAGE in unschedulable:
        env = {k: v for k, v in env.items() if k not in (ENV_TRIAGE_MODEL_ID,
                                                         ENV_TRIAGE_ENDPOINT,
                                                         ENV_CANDIDATES_TRIAGE)}
    listed = _candidates(env, ENV_CANDIDATES_MULLING)
    bound = env.get(ENV_MODEL, "").strip()
    if bound and (not listed or listed[0].model != bound):
        # the bound model leads, as in the control plane's list
        score = next((c.score for c in listed if c.model == bound), 0.0)
        listed = (CandidateModel(bound, score), *(c for c in listed if c.model != bound))
    triage_model = env.get(ENV_TRIAGE_MODEL_ID, "").strip()
    if not triage_model:
        # Not bound (yet): the published list's first entry is the one to try; the bound
        # model, once there is one, leads that list anyway.
        listed_triage = _candidates(env, ENV_CANDIDATES_TRIAGE)
        triage_model = listed_triage[0].model if listed_triage else ""
    states = providers or {}
    return AgentProfile(
        id=identity.id,
        role=identity.role,
        mulling=listed,
        triage=(CandidateModel(triage_model),) if triage_model else (),
        mulling_static=_static(bound, env.get(ENV_MODEL_ENDPOINT, ""), states),
        triage_static=_static(triage_model, env.get(ENV_TRIAGE_ENDPOINT, ""), states),
        system_prompt=system_prompt or
        f"You are {identity.name}, a {identity.role} in an engineering crew.",
        tools=tuple(tools),
        unschedulable=unschedulable,
    )


def _static(model: str, endpoint: str, states: Mapping[str, ProviderState]) -> StaticTarget | None:
    """The provider serving the bound endpoint: the operator's, else a direct probe's;
    with no provider state at all, the bare endpoint (the spec's last resort)."""
    endpoint = endpoint.strip().rstrip("/")
    if not model or not endpoint:
        return None
    serving = sorted((is_direct(s.provider), s.provider) for s in states.values()
                     if s.endpoint.rstrip("/") == endpoint)
    if serving:
        state = states[serving[0][1]]
        return StaticTarget(state.provider, endpoint, model, state.context_length)
    if not states:
        return StaticTarget(endpoint, endpoint, model)
    return None


def bound_endpoints(env: Mapping[str, str]) -> tuple[str, ...]:
    """The endpoints the binding names, for the direct-probe fallback."""
    return tuple(e for e in (env.get(ENV_MODEL_ENDPOINT, ""), env.get(ENV_TRIAGE_ENDPOINT, ""))
                 if e.strip())


def _marking_direct(publish: Publish) -> Publish:
    """Publish a directly probed provider's state as provisional: it stands in for the
    operator's, so the runtime waits for what it lacks instead of refusing the call."""

    async def marked(state: ProviderState) -> None:
        if is_direct(state.provider) and not state.provisional:
            state = state.model_copy(update={"provisional": True})
        await publish(state)

    return marked


async def _declare(book: OccupancyBook, bucket: Bucket) -> None:
    for model, mib in (await read_declared_sizes(bucket)).items():
        book.declare(model, mib)


# -- providers -----------------------------------------------------------------------------

MakeClient = Callable[[ProviderState], ProviderClient]


class ProviderDirectory(Mapping[str, ProviderClient]):
    """A client per provider the shared state lists, kept in step with the bucket.

    The operator publishes each ModelProvider's state, endpoint and sizes; an agent
    needs no bundle of its own to unload, preload and re-probe the same providers.
    """

    def __init__(self, states: Bucket, make: MakeClient) -> None:
        self._bucket = states
        self._make = make
        self._clients: dict[str, ProviderClient] = {}
        self.states: dict[str, ProviderState] = {}

    async def refresh(self) -> None:
        """Read the bucket; new providers get a client, moved ones a new one."""
        seen: dict[str, ProviderState] = {}
        for key in await self._bucket.keys():
            entry = await self._bucket.get(key)
            if entry is None:
                continue
            try:
                state = ProviderState.from_json(entry.value)
            except ValueError as error:
                log.warning("unreadable provider state %s: %s", key, error)
                continue
            seen[state.provider] = state
        for name, state in seen.items():
            current = self._clients.get(name)
            if current is None or current.endpoint.rstrip("/") != state.endpoint.rstrip("/"):
                if current is not None:
                    await _close(current)
                self._clients[name] = self._make(state)
        # A provider whose state is gone (deleted, or a direct: document withdrawn once
        # the operator took over) is no longer called: its client's connections close,
        # and nothing can re-probe (and so republish) it through this directory.
        for name in sorted(self._clients.keys() - seen.keys()):
            await _close(self._clients.pop(name))
        self.states = seen

    def __getitem__(self, name: str) -> ProviderClient:
        return self._clients[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)

    async def close(self) -> None:
        for client in self._clients.values():
            await _close(client)
        self._clients.clear()


async def _close(client: ProviderClient) -> None:
    close = getattr(client, "close", None)
    if close is not None:
        try:
            await close()
        except Exception as error:  # closing must not stop a shutdown
            log.warning("closing the client of %s failed: %s", client.name, error)


class AfterCall:
    """Re-probes the provider a call changed the memory of, so the next placement sees
    the copy it left; never a ``direct:`` provider the operator's state has replaced
    (its document was withdrawn: a probe would publish it again and count the card
    twice)."""

    def __init__(self, directory: ProviderDirectory, direct: DirectProbe,
                 prober: Prober) -> None:
        self._directory = directory
        self._direct = direct
        self._prober = prober

    async def __call__(self, provider: str) -> None:
        if is_direct(provider) and not self._direct.active:
            return
        client = self._directory.get(provider)
        if client is not None:
            await self._prober.probe_one(client)


# -- the process -----------------------------------------------------------------------------


async def serve_agent(
    kv: KV,
    bus: Bus,
    identity: AgentIdentity,
    *,
    env: Mapping[str, str],
    settings: Settings,
    make_client: MakeClient,
    chat_factory: ClientFactory,
    clock: Clock,
    ready: Callable[[AgentProfile], None] | None = None,
    toolbox: Mapping[str, Tool] | None = None,
    on_record: Sequence[Callable[[CallRecord], None]] = (),
    changed: Callable[[AgentProfile], None] | None = None,
) -> None:
    """Run one agent until cancelled; on the way out, threads in progress end and give
    their tickets and plans back while the store is still open.

    ``toolbox`` holds the tools ``enabledTools`` may name; ``on_record`` listeners get
    every finished call (the call log); ``changed`` hears of every new profile, as the
    shared state moves the static targets or a ConfigMap edit changes the prompt.
    """
    tools = enabled_tools(env, toolbox or {})
    prompts = prompt_source(env)
    states = await kv.bucket(PROVIDER_STATE_BUCKET)
    sizes = await kv.bucket(MODEL_SIZES_BUCKET)
    directory = ProviderDirectory(states, make_client)
    prober = Prober([], clock=clock, publish=_marking_direct(publish_to_kv(states)))
    direct = DirectProbe(bound_endpoints(env), states=states, prober=prober,
                         make_client=make_client)

    after_call = AfterCall(directory, direct, prober)
    stack = await build_stack(kv, clients=directory, client_factory=chat_factory, clock=clock,
                              settings=settings.runtime, declared=sizes_from_env(env),
                              after_call=after_call, bus=bus)
    for listener in on_record:
        stack.agents.on_record(listener)

    async def follow() -> AgentProfile:
        """Read the shared state once: providers (probing directly while it has none),
        declared sizes; the profile they give."""
        await directory.refresh()
        if await direct.step(directory.states):
            await directory.refresh()
        await _declare(stack.runtime.occupancy, sizes)
        return profile_from_env(env, identity, providers=directory.states, tools=tools,
                                system_prompt=prompts.reread() if prompts else None)

    part: CrewCoordinator | CrewMember | None = None
    try:
        profile = await follow()
        if identity.coordinates:
            part = CrewCoordinator(bus, identity.crew, profile, stack.agents, settings)
        else:
            part = CrewMember(bus, identity.crew, profile, stack.agents, settings)
        await part.start()
        if ready is not None:
            ready(profile)
        while True:  # providers come and go; the directory and the profile follow
            await clock.sleep(settings.runtime.discovery_seconds)
            try:
                latest = await follow()
            except StoreError as error:
                log.warning("cannot read the providers' state: %s", error)
                continue
            if latest != profile:
                # read on every use, so the next thread and roll call see it
                profile = part.profile = latest
                if changed is not None:
                    changed(profile)
    finally:
        if part is not None:
            await part.stop()
        with contextlib.suppress(Exception):
            await stack.close()
        await directory.close()


def describe(profile: AgentProfile) -> dict[str, Any]:
    """What the process runs with, for its first log line."""
    return {
        "agent": profile.id,
        "role": profile.role,
        "mulling": [c.model for c in profile.mulling],
        "triage": [c.model for c in profile.triage],
        "tools": [t.name for t in profile.tools],
        "unschedulable": dict(profile.unschedulable),
        "static": {phase: f"{t.model} on {t.provider}" for phase, t in
                   (("mulling", profile.mulling_static), ("triage", profile.triage_static))
                   if t is not None},
    }

