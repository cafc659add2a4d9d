"""The reconcilers: what the operator does when an object changes or a probe ends.

Everything is driven by state (the spec's third design principle): an Agent is
scheduled again only when something that can change its result changed — its own
spec or labels, a Model, a provider's readiness or capacity, a policy, an archetype,
the KubemootConfig. The :meth:`Reconciler.observe` entry point compares what a kind's
scheduling depends on (its *fingerprint*) with the last version seen, and schedules
exactly the Agents :mod:`kubemoot.operator.view` says the change affects. The only
timer is the provider probe, and a probe that finds nothing new moves no Agent.

Nothing here raises into kopf: a malformed object gets a ``Valid=False`` condition and
an ``InvalidSpec`` event naming the field; an API error is logged and the next change
(or probe) tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from kubemoot import metrics
from kubemoot.api import (
    DEFAULT_MAX_AGE_SECONDS,
    RESOURCE_TYPES,
    Agent,
    CrewSchedulingPolicy,
    InputError,
    Model,
    ModelProvider,
    MootArchetype,
    Resource,
    parse_manifest,
)
from kubemoot.clock import Clock
from kubemoot.gates import Outcome
from kubemoot.operator.batch import KeptRoster
from kubemoot.operator.binding import (
    AgentWriter,
    policy_conditions,
    status_binding_holds,
    still_feasible,
)
from kubemoot.operator.deployment import carries_binding, deployment_name, env_patch
from kubemoot.operator.events import EventRecorder, ObjectRef
from kubemoot.operator.kube import KubeClient, KubeError, custom_path
from kubemoot.operator.pinning import PinningPublisher, load_missing_pinned
from kubemoot.operator.probe import client_for, model_status, provider_status
from kubemoot.operator.status import condition, find_condition, merge_conditions, merge_patch
from kubemoot.operator.status import to_datetime as _dt
from kubemoot.operator.view import (
    ClusterView,
    affected_by_archetype,
    affected_by_models,
    affected_by_policies,
    affected_by_provider,
    agent_key,
    bound_providers,
    deferred,
    waiting,
)
from kubemoot.operator.watch import DeploymentWatch
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober
from kubemoot.runtime.builder import Runtime
from kubemoot.runtime.pinning import PINNED_CALLER, pinned_by_provider, unpin, unpinned
from kubemoot.scheduling.candidate import stale_age
from kubemoot.scheduling.result import AgentResult
from kubemoot.scheduling.roster import AgentRoster
from kubemoot.scheduling.scheduler import SchedulingPass
from kubemoot.scheduling.snapshot import ClusterSnapshot
from kubemoot.scheduling.warnings import PROVIDER_NOT_FOUND
from kubemoot.settings import DEFAULTS
from kubemoot.store.declared import (
    DeclaredSize,
    declared_sizes,
    publish_declared_sizes,
    read_declared_sizes,
)
from kubemoot.store.documents import ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.protocol import Bucket, StoreError

__all__ = ["Reconciler"]

log = logging.getLogger(__name__)


def _fingerprint(resource: Resource | None) -> Any:
    """The *inputs* of scheduling an object holds: a change re-binds the Agents it affects.

    Labels, spec and readiness (DESIGN §4 "Stable bindings"). What a probe reads of live
    activity — loaded models, VRAM in use, observed footprints — is :func:`_evidence`
    instead: it only rechecks that the current bindings still pass their gates.
    """
    if resource is None:
        return None
    data = resource.to_manifest()
    meta = data.get("metadata", {})
    base = {"labels": meta.get("labels"), "spec": data.get("spec")}
    status = data.get("status") or {}
    if isinstance(resource, Agent):
        base["annotations"] = meta.get("annotations")  # an annotation forces a reconcile
    elif isinstance(resource, Model):
        base["status"] = {"ready": status.get("ready")}
    elif isinstance(resource, ModelProvider):
        base["status"] = {"ready": status.get("ready")}
        base["annotations"] = meta.get("annotations")
    return base


def _evidence(resource: Resource | None) -> Any:
    """What a probe observed of an object's live state; gates read it, bindings keep."""
    if resource is None:
        return None
    status = resource.to_manifest().get("status") or {}
    if isinstance(resource, Model):
        return status.get("footprintMiB")
    if isinstance(resource, ModelProvider):
        capacity = dict(status.get("capacity") or {})
        capacity.pop("agentCount", None)  # the operator's own bookkeeping
        return capacity
    return None


class Reconciler:
    """State, probing and writing of one operator process."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        clock: Clock,
        bucket: Bucket | None = None,
        sizes: Bucket | None = None,
        runtime: Runtime | None = None,
        probe_interval: float = DEFAULTS.probe_interval_seconds,
        probe_timeout: float = DEFAULTS.probe_timeout_seconds,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.bucket = bucket
        #: ``kubemoot_model_sizes``: the declared sizes the operator publishes.
        self.sizes = sizes
        self._published: dict[str, DeclaredSize] | None = None
        self._sizes_lock = asyncio.Lock()
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.events = EventRecorder(kube, clock=clock)
        #: The per-call runtime the pinned loads are placed through (None: no loads).
        self.runtime = runtime
        #: provider → models its Models pin there, published with each probe
        self.pins: dict[str, list[str]] = {}
        self._pinning = asyncio.Lock()
        self.prober = Prober(
            [], clock=clock,
            publish=None if bucket is None else PinningPublisher(bucket, lambda: self.pins),
            interval_seconds=probe_interval,
        )
        self.clients: dict[str, OllamaProvider] = {}
        self._client_specs: dict[str, Any] = {}
        self.indexes: Mapping[str, Any] = {}
        self.seen: dict[str, Resource] = {}
        #: (agent, trigger) for every Agent scheduled, in order: the operator's audit trail.
        self.reconciled: list[tuple[str, str]] = []
        #: Providers each Agent is bound to, as the operator last wrote it. The watch
        #: brings that status back later; until then these bindings count toward
        #: agentCount, as kube-scheduler's assumed pods do (a burst of new Agents must
        #: not overcommit a provider between two watch events).
        self.assumed: dict[str, frozenset[str]] = {}
        #: Whether each Agent had a phase without a binding when last written.
        self._waiting: dict[str, bool] = {}
        #: The Deployment env of each Agent's last written result.
        self._envs: dict[str, dict[str, str]] = {}
        #: Each Agent's last written result: what a recheck keeps while it stays feasible.
        self._results: dict[str, AgentResult] = {}
        self.deployments = DeploymentWatch(kube, self.deployment_changed, clock=clock)
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._writer = AgentWriter(kube, self.events)
        #: Every Agent of the view, filed for a pass and kept between passes: a batch of
        #: every Agent (a config, provider or Model change that concerns them all) files
        #: only those that changed since the last one.
        self.batches = KeptRoster()
        #: Objects created before this are not news when first seen (a restart).
        self.started_at = self.now()

    @property
    def roster(self) -> AgentRoster:
        """The Agents as filed at the last batch of every Agent."""
        return self.batches.roster

    async def close(self) -> None:
        """Close the Deployment watches, the provider clients and the API client."""
        await self.deployments.close()
        for client in self.clients.values():
            await client.close()
        self.clients.clear()
        await self.kube.close()

    # ------------------------------------------------------------------ the view

    def bind(self, kwargs: Mapping[str, Any]) -> None:
        """Keep the kopf indexes a handler was given (they are live views)."""
        self.indexes = kwargs

    def view(self) -> ClusterView:
        return ClusterView.from_indexes(self.indexes)

    def now(self) -> datetime:
        """The clock's time in whole seconds: the API server stores times at that
        precision, so every timestamp the operator writes (conditions, lastProbedAt,
        lastUnschedulable.observedAt) has one precision and compares equal on re-read."""
        return _dt(self.clock.now()).replace(microsecond=0)

    # ------------------------------------------------------------------ events

    async def observe(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of one of our kinds; never raises."""
        try:
            await self._observe(kind, event_type, body)
        except Exception:  # a bug must not kill kopf's worker for this object
            metrics.RECONCILES.labels(kind=kind, result="error").inc()
            log.exception("reconciling %s %s failed", kind, ObjectRef.of(body).name)
        else:
            metrics.RECONCILES.labels(kind=kind, result="ok").inc()

    async def _observe(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        ref = ObjectRef.of(body, kind=kind)
        key = f"{kind}/{ref.namespace or ''}/{ref.name}"
        new: Resource | None = None
        if event_type != "DELETED":
            try:
                new = parse_manifest(dict(body))
            except InputError as error:
                await self._report_invalid(kind, body, error)
            else:
                await self._clear_invalid(kind, body, new)
        old = self.seen.get(key)
        if new is None:
            self.seen.pop(key, None)
        else:
            self.seen[key] = new
        if kind == "Agent":
            # Deployments are watched where Agents live, and nowhere else.
            self.deployments.follow({k.split("/")[1] for k in self.seen
                                     if k.startswith("Agent/")})
        if isinstance(new, ModelProvider) or (new is None and isinstance(old, ModelProvider)):
            await self._provider_changed(ref.name, new)
        if isinstance(new, Model) and (
            old is None or old.spec != new.spec or old.status is None
        ):
            await self._refresh_model(new)
        if isinstance(new, MootArchetype):
            await self._describe_archetype(new)
        if isinstance(new, Model) or (new is None and isinstance(old, Model)):
            await self.publish_sizes()
            await self._pins_changed()
        if new is None and isinstance(old, Agent):
            # A deleted Agent frees its slots: Agents waiting for them may bind now.
            gone = agent_key(old)
            freed = self.assumed.pop(gone, None)
            self._waiting.pop(gone, None)
            self._envs.pop(gone, None)
            self._results.pop(gone, None)
            await self._slots_freed(bound_providers(old) if freed is None else freed)
        if _fingerprint(old) == _fingerprint(new):
            if isinstance(old, ModelProvider) and isinstance(new, ModelProvider) and (
                _probed_at(old) != _probed_at(new)
            ):
                await self._evidence_refreshed(old)
            if old is not None and new is not None and _evidence(old) != _evidence(new):
                await self._evidence_changed(kind, ref.name, [old, new])
            # Only status moved (often our own write): a policy's Scheduled condition
            # follows the statuses of the Agents it governs.
            if isinstance(new, CrewSchedulingPolicy):
                await self.reconcile_policies([new])
            elif isinstance(new, Agent):
                policy = self.view().snapshot().resolve_policy(new).policy
                if policy is not None:
                    await self.reconcile_policies([policy])
            return
        view = self.view()
        snapshot = view.snapshot()
        versions = [r for r in (old, new) if r is not None]
        affected: set[str] = set()
        if kind == "Agent":
            affected = {key.split("/", 1)[1]} if new is not None else set()
        elif kind == "Model":
            affected = affected_by_models(snapshot, versions)  # type: ignore[arg-type]
        elif kind == "ModelProvider":
            affected = affected_by_provider(snapshot, ref.name, view.models.values())
        elif kind == "CrewSchedulingPolicy":
            affected = affected_by_policies(snapshot, versions)  # type: ignore[arg-type]
        elif kind == "MootArchetype":
            affected = affected_by_archetype(snapshot, ref.name)
        elif kind == "KubemootConfig":
            affected = set(view.agents)
        # What this process sees first and that existed before it started is no change:
        # an Agent bound by an earlier operator keeps that binding while it stands
        # (a restart must not roll every crew). Any later change of an input re-binds.
        adopt = old is None and (kind == "Agent" or _existed_before(new, self.started_at))
        await self.reconcile_agents(affected, trigger=f"{kind}/{ref.name}", trust_status=adopt)
        if isinstance(new, CrewSchedulingPolicy):
            await self.reconcile_policies([new])
        elif new is None and isinstance(old, Agent):
            # A deleted Agent no longer counts in its policy's Scheduled condition.
            policy = snapshot.resolve_policy(old).policy
            if policy is not None:
                await self.reconcile_policies([policy])

    # ------------------------------------------------------------------ agents

    async def reconcile_agents(
        self, keys: Collection[str], *, trigger: str, keep_feasible: bool = False,
        trust_status: bool = False, write_kept: bool = True,
    ) -> None:
        """Schedule the Agents ``keys`` (``namespace/name``) in one pass and write results.

        With ``keep_feasible`` (a trigger that is no input of the Agents: live evidence,
        their Deployment) an Agent whose every phase is still bound to a Model the new
        pass finds feasible keeps the result written at its last bind, scores and all:
        live activity never moves a binding (DESIGN §4 "Stable bindings").
        ``trust_status``: an Agent this process has not written yet (the operator
        restarted) keeps the binding its status holds while that binding stands, and
        nothing is written for it.
        ``write_kept=False``: a result kept by ``keep_feasible`` is not written again.
        It is what this process last wrote, so the write would change nothing but cost
        a read of the Deployment per Agent; a caller whose trigger is the Deployment
        itself (which may have lost the env) leaves it True.
        """
        if not keys:
            return
        async with self._lock:
            view = self.view()
            batch = {k: view.agents[k] for k in keys if k in view.agents}
            if not batch:
                return
            now = self.now()
            snapshot = view.snapshot(exclude=keys, assumed=self.assumed)
            scheduling = SchedulingPass(snapshot, now=now)
            # One pass over the batch in (namespace, name) order, as `kubemoot schedule`
            # binds a bundle: the same Agents meet the same counts in both.
            scheduling.schedule_all(self.batches.file(view.agents, batch))
            policies: dict[str, CrewSchedulingPolicy] = {}
            freed: set[str] = set()
            for result in scheduling.results:
                agent = result.agent
                key = agent_key(agent)
                kept = self._results.get(key)
                if keep_feasible and kept is not None and still_feasible(kept, result):
                    result = kept
                    if not write_kept:
                        self.reconciled.append((key, trigger))
                        if result.policy is not None:
                            policies[result.policy.key] = result.policy
                        continue
                elif trust_status and kept is None and status_binding_holds(agent, result):
                    self.reconciled.append((key, trigger))
                    self.assumed[key] = frozenset(bound_providers(agent))
                    self._waiting[key] = False
                    continue
                self.reconciled.append((key, trigger))
                before = self.assumed.get(key, frozenset(bound_providers(agent)))
                try:
                    await self._writer.write(agent, result, now=now)
                except KubeError as error:
                    log.warning("writing Agent %s failed: %s", key, error)
                    # Not written: forget the assumption, the Agent's status is the truth.
                    self.assumed.pop(key, None)
                    self._waiting.pop(key, None)
                    self._envs.pop(key, None)
                    self._results.pop(key, None)
                else:
                    bound = frozenset(
                        p.provider for p in result.phases.values() if p.provider is not None
                    )
                    self.assumed[key] = bound
                    self._waiting[key] = any(
                        p.outcome is not Outcome.PLACE for p in result.phases.values()
                    )
                    freed |= before - bound
                    self._envs[key] = dict(result.env)
                    self._results[key] = result
                if result.policy is not None:
                    policies[result.policy.key] = result.policy
        await self.reconcile_policies(policies.values())
        await self._slots_freed(freed)

    async def deployment_changed(
        self, event_type: str, namespace: str, deployment: Mapping[str, Any]
    ) -> None:
        """A crew's Deployment appeared, changed or went away: re-apply its Agent's env.

        Only Agents whose Deployment lacks the env of their last binding (or that were
        never written by this process) are scheduled again; the operator's own patch
        comes back as an event that needs nothing.
        """
        name = str((deployment.get("metadata") or {}).get("name") or "")
        keys: set[str] = set()
        inherited: set[str] = set()  # bound by an earlier operator process: env in place
        for key, agent in self.view().agents.items():
            if agent.namespace != namespace or deployment_name(agent) != name:
                continue
            env = self._envs.get(key)
            try:
                stale = env is None or env_patch(deployment, env) is not None
            except ValueError:  # no containers: the reconcile reports it
                stale = True
            if event_type == "DELETED":
                keys.add(key)
            elif not stale:
                continue
            elif env is None and carries_binding(deployment):
                inherited.add(key)
            else:
                keys.add(key)
        trigger = f"Deployment/{namespace}/{name}"
        await self.reconcile_agents(keys, trigger=trigger, keep_feasible=True)
        await self.reconcile_agents(inherited, trigger=trigger, keep_feasible=True,
                                    trust_status=True)

    async def _evidence_changed(
        self, kind: str, name: str, versions: list[Resource]
    ) -> None:
        """A probe saw other live state (loads, VRAM in use, a footprint): recheck only.

        The Agents the object concerns are scheduled again so that a binding that now
        fails a gate (a footprint that no longer fits the card) or a waiting phase that
        can now bind is acted on; every other Agent keeps its binding as written.
        """
        view = self.view()
        snapshot = view.snapshot()
        if kind == "Model":
            keys = affected_by_models(snapshot, versions)  # type: ignore[arg-type]
        else:
            keys = affected_by_provider(snapshot, name, view.models.values())
        await self.reconcile_agents(keys, trigger=f"{kind}/{name} observed",
                                    keep_feasible=True, trust_status=True, write_kept=False)

    async def _slots_freed(self, providers: Collection[str]) -> None:
        """Schedule again the waiting Agents that could use a slot an Agent gave up.

        An Agent left Unschedulable or deferred at a provider's agent limit names
        ``agentCount`` among its recheck triggers; that count drops when another Agent
        is deleted or moves away. Agents already bound are left where they are.
        """
        view = self.view()
        snapshot = view.snapshot(assumed=self.assumed)
        for provider in sorted(providers):
            keys = {
                key for key in affected_by_provider(snapshot, provider, view.models.values())
                if key in view.agents and self._waiting.get(key, waiting(view.agents[key]))
            }
            await self.reconcile_agents(keys, trigger=f"slot freed on {provider}")

    async def _evidence_refreshed(self, old: ModelProvider) -> None:
        """A probe refreshed ``lastProbedAt`` and nothing else: act on "is refreshed".

        Agents whose decision named this provider's freshness as a recheck trigger are
        scheduled again: those deferred on its evidence, and those whose policy judged
        the previous probe stale (a stale candidate may now win). Agents for which the
        previous probe was still fresh cannot change and are left alone.
        """
        name = old.metadata.name
        view = self.view()
        snapshot = view.snapshot(assumed=self.assumed)
        now = self.now()
        keys: set[str] = set()
        for key in affected_by_provider(snapshot, name, view.models.values()):
            agent = view.agents.get(key)
            if agent is None:
                continue
            policy = snapshot.resolve_policy(agent).policy
            max_age = (DEFAULT_MAX_AGE_SECONDS if policy is None
                       else policy.spec.freshness.max_age_seconds)
            if deferred(agent) or stale_age(old, now, max_age) is not None:
                keys.add(key)
        await self.reconcile_agents(keys, trigger=f"ModelProvider/{name} refreshed")

    async def _pins_changed(self) -> None:
        """A Model started or stopped pinning: republish the providers concerned at once
        (their eviction must know now, not at the next probe) and load what is missing."""
        pins = pinned_by_provider(self.view().models.values())
        if pins == self.pins:
            return
        changed = {p for p in pins.keys() | self.pins.keys()
                   if pins.get(p) != self.pins.get(p)}
        dropped = unpinned(self.pins, pins)
        self.pins = pins
        for provider in sorted(changed):
            await self.probe(provider)
        await self.keep_pinned(providers=changed)
        await self._unpin(dropped)

    async def _unpin(self, dropped: list[tuple[str, str]]) -> None:
        """The copies of pins withdrawn get the runtime's keep-alive (not forever)."""
        runtime = self.runtime
        if runtime is None:
            return
        keep_alive = runtime.settings.engine_keep_alive_seconds
        for provider, model in dropped:
            client = self.clients.get(provider)
            if client is None:
                continue
            async with self._pinning:
                done = await unpin(
                    runtime.planner, provider=provider, model=model,
                    holder=runtime.calls.holder_id(PINNED_CALLER, "unpin", "unpin"),
                    renew=partial(client.preload, model, keep_alive=keep_alive))
            if done:
                await self.probe(provider)  # the state shows the copy's new expiry

    async def keep_pinned(self, *, providers: Collection[str] | None = None) -> list[str]:
        """Load back the pinned models their ready providers lost (after a probe round);
        ``provider/model`` of each load, whose provider is then probed again."""
        if self.runtime is None or not self.pins:
            return []
        pins = {p: m for p, m in self.pins.items() if providers is None or p in providers}
        async with self._pinning:  # a Model event and the probe round: one load at a time
            states = {name: state for name, state in self.prober.last_states.items()
                      if name in self.clients}
            loaded = await load_missing_pinned(self.runtime, self.clients, states, pins)
        for provider in sorted({item.split("/", 1)[0] for item in loaded}):
            await self.probe(provider)  # the status and the state show the copy now
        return loaded

    async def clear_sizes_without_models(self) -> None:
        """Empty ``kubemoot_model_sizes`` when the cluster holds no Model at all.

        Asked of the API server, not of the watch: before kopf's first listing the
        operator has seen no Model either, and only the list tells "none yet" from
        "none". One GET per probe round, and only while no Model has been seen.
        """
        if self.sizes is None or self._published == {} or any(
            isinstance(r, Model) for r in self.seen.values()
        ):
            return
        try:
            # one item is enough to know: ask for no more
            listed = await self.kube.get(custom_path(Model.PLURAL, "").rstrip("/")
                                         + "?limit=1")
        except KubeError as error:
            log.warning("listing Models to clean the declared sizes failed: %s", error)
            return
        if listed is None or listed.get("items"):
            return  # Models exist: their events publish the sizes
        await self.publish_sizes(models=())

    async def publish_sizes(self, *, models: Iterable[Model] | None = None) -> None:
        """Copy the Models' declared ``vramMib`` to the shared state when it changed.

        Agents and gateways have no Model resources; they read the declaration from
        ``kubemoot_model_sizes`` (docs/shared-state.md) to size a model nobody has
        loaded yet. A failed write is retried with the next Model event.
        """
        if self.sizes is None:
            return
        async with self._sizes_lock:  # a Model event and the probe round may both write
            if models is None:
                models = [r for r in self.seen.values() if isinstance(r, Model)]
            wanted = declared_sizes(models)
            if wanted == self._published:
                return
            await publish_declared_sizes(self.sizes, wanted, now=self.clock.now())
            self._published = wanted if await _holds(self.sizes, wanted) else None

    # ------------------------------------------------------------------ policies

    async def reconcile_policies(self, policies: Iterable[CrewSchedulingPolicy]) -> None:
        """Valid (phases against the archetype) and Scheduled (governed Agents)."""
        view = self.view()
        snapshot = view.snapshot()
        scheduling = SchedulingPass(snapshot, now=self.now())
        for policy in policies:
            current = view.policies.get(f"{policy.namespace}/{policy.metadata.name}", policy)
            governed = [a for a in snapshot.agents if _governs(snapshot, policy, a)]
            wanted = policy_conditions(scheduling.plan(current), governed, now=self.now())
            await self._write_conditions(current, wanted)

    # ------------------------------------------------------------------ providers

    async def _provider_changed(self, name: str, provider: ModelProvider | None) -> None:
        """Keep one client per provider; probe at once when it appears or its spec moves."""
        if provider is None:
            client = self.clients.pop(name, None)
            self._client_specs.pop(name, None)
            if client is not None:
                await client.close()
            if self.bucket is not None:
                try:
                    await self.bucket.delete(encode_token(name))
                except StoreError as error:
                    log.warning("removing the state of %s from the KV failed: %s", name, error)
            self.prober.last_states.pop(name, None)
            for model in self.view().models.values():
                if model.spec.provider_ref == name:  # now names nothing: say so
                    await self._refresh_model(model)
            return
        wanted = (provider.spec, provider.metadata.annotations)
        if self._client_specs.get(name) == wanted:
            return
        old = self.clients.pop(name, None)
        if old is not None:
            await old.close()
        self._client_specs[name] = wanted
        try:
            self.clients[name] = client_for(provider, clock=self.clock,
                                            timeout=self.probe_timeout)
        except InputError as error:
            await self._report_invalid(provider.KIND, _body_of(provider), error)
            return
        await self.probe(name)
        await self.keep_pinned(providers=[name])  # a new card gets its pins at once

    async def probe_all(self) -> None:
        """Probe every known provider at once."""
        await asyncio.gather(*(self.probe(name) for name in list(self.clients)))

    async def run_probes(self) -> None:
        """The probe timer: every ``probe_interval`` seconds of the clock until stopped.

        Each round also settles the published sizes when no Model has been seen: with
        no Model at all no Model event ever comes, and keys an earlier run (or a Model
        deleted while no operator ran) left behind would stay forever.
        """
        while not self._stopping.is_set():
            await self.probe_all()
            await self.keep_pinned()
            await self.clear_sizes_without_models()
            with contextlib.suppress(TimeoutError):
                await self.clock.wait_for(self._stopping.wait(), self.probe_interval)

    def stop_probes(self) -> None:
        """End :meth:`run_probes` and the Deployment watches (kopf's cleanup calls this)."""
        self._stopping.set()
        self.deployments.stop()

    async def probe(self, name: str) -> ProviderState | None:
        """Probe one provider: status, Ready condition, KV document, its Models' status."""
        client = self.clients.get(name)
        if client is None:
            return None
        state = await self.prober.probe_one(client)
        view = self.view()
        provider = view.providers.get(name)
        if provider is None:
            return state
        counts = view.agent_counts(assumed=self.assumed)
        wanted = provider_status(state, provider, agent_count=counts.get(name, 0), now=self.now())
        old = _status_of(provider)
        try:
            if merge_patch(old, wanted) != {}:
                await self.kube.merge_patch(
                    custom_path(provider.PLURAL, name, subresource="status"),
                    {"status": merge_patch(old, wanted)},
                )
        except KubeError as error:
            log.warning("writing the status of ModelProvider %s failed: %s", name, error)
        was_ready = None if provider.status is None else provider.status.ready
        if not state.ready and was_ready is not False:  # news: ready or unknown before
            await self.events.emit(ObjectRef.of(_body_of(provider)), type="Warning",
                                   reason="ProbeFailed", message=state.reason or "probe failed")
        for model in view.models.values():
            if model.spec.provider_ref == name:
                await self._refresh_model(model, state=state)
        return state

    async def _describe_archetype(self, archetype: MootArchetype) -> None:
        """``status.phaseNames`` for ``kubectl get`` (a [*] column prints one item)."""
        old = _status_of(archetype)
        wanted = {**old, "phaseNames": ", ".join(archetype.phase_names)}
        if archetype.metadata.generation is not None:
            wanted["observedGeneration"] = archetype.metadata.generation
        diff = merge_patch(old, wanted)
        if diff == {}:
            return
        try:
            await self.kube.merge_patch(
                custom_path(archetype.PLURAL, archetype.metadata.name, subresource="status"),
                {"status": diff},
            )
        except KubeError as error:
            log.warning("writing the status of MootArchetype %s failed: %s",
                        archetype.metadata.name, error)

    async def _refresh_model(self, model: Model, *, state: ProviderState | None = None) -> None:
        provider = model.spec.provider_ref
        providers = self.view().providers
        known = provider in providers
        if state is None:
            state = self.prober.last_states.get(provider)
        wanted = model_status(model, state, provider_known=known, now=self.now(),
                              known_providers=list(providers))
        if wanted is None:
            return
        old = _status_of(model)
        diff = merge_patch(old, wanted)
        if diff == {}:
            return
        ready = find_condition(wanted.get("conditions") or [], "Ready") or {}
        before = find_condition(old.get("conditions") or [], "Ready") or {}
        if ready.get("reason") == PROVIDER_NOT_FOUND and before.get("message") != ready.get(
            "message"
        ):  # news: a Warning event, so `kubectl get events` shows the typo too
            await self.events.emit(ObjectRef.of(_body_of(model)), type="Warning",
                                   reason=PROVIDER_NOT_FOUND,
                                   message=str(ready.get("message")))
        try:
            await self.kube.merge_patch(
                custom_path(model.PLURAL, model.metadata.name, subresource="status"),
                {"status": diff},
            )
        except KubeError as error:
            log.warning("writing the status of Model %s failed: %s", model.metadata.name, error)

    # ------------------------------------------------------------------ conditions

    async def _write_conditions(self, resource: Resource, wanted: list[dict[str, Any]]) -> None:
        old = _status_of(resource)
        # PolicyValid was folded into Valid; drop what an older operator wrote.
        kept = [c for c in old.get("conditions") or [] if c.get("type") != "PolicyValid"]
        conditions = merge_conditions(kept, wanted)
        new = {**old, "conditions": conditions}
        if resource.metadata.generation is not None:
            new["observedGeneration"] = resource.metadata.generation
        diff = merge_patch(old, new)
        if diff == {}:
            return
        try:
            await self.kube.merge_patch(_status_path(resource.KIND, _body_of(resource)),
                                        {"status": diff})
        except KubeError as error:
            log.warning("writing the conditions of %s failed: %s", resource.key, error)

    async def _report_invalid(
        self, kind: str, body: Mapping[str, Any], error: InputError
    ) -> None:
        """Valid=False naming the field, and an InvalidSpec event when that is news."""
        message = error.describe()
        status = body.get("status")
        old = status.get("conditions") if isinstance(status, Mapping) else None
        old_list = old if isinstance(old, list) else []
        previous = find_condition(old_list, "Valid")
        wanted = condition("Valid", False, "InvalidSpec", message, now=self.now())
        if previous is not None and previous.get("status") == "False" and (
            previous.get("message") == message
        ):
            return
        try:
            await self.kube.merge_patch(
                _status_path(kind, body),
                {"status": {"conditions": merge_conditions(old_list, [wanted])}},
            )
        except KubeError as error_:
            log.warning("marking %s %s invalid failed: %s", kind, ObjectRef.of(body).name, error_)
        await self.events.emit(ObjectRef.of(body, kind=kind), type="Warning",
                               reason="InvalidSpec", message=message)

    async def _clear_invalid(self, kind: str, body: Mapping[str, Any], new: Resource) -> None:
        if isinstance(new, CrewSchedulingPolicy):
            return  # its Valid condition also judges the phases: reconcile_policies writes it
        old = _status_of(new).get("conditions") or []
        previous = find_condition(old, "Valid")
        if previous is None or previous.get("status") == "True":
            return
        valid = condition("Valid", True, "Valid", "the object is well-formed", now=self.now())
        await self._write_conditions(new, [valid])


async def _holds(bucket: Bucket, wanted: Mapping[str, DeclaredSize]) -> bool:
    """Whether the bucket now publishes exactly ``wanted`` (a write may have failed)."""
    try:
        held = await read_declared_sizes(bucket)
    except StoreError:
        return False
    return held == {model: doc.vram_mib for model, doc in wanted.items()}


def _existed_before(resource: Resource | None, moment: datetime) -> bool:
    created = None if resource is None else resource.metadata.creation_timestamp
    return created is not None and created < moment


def _probed_at(provider: ModelProvider) -> datetime | None:
    return None if provider.status is None else provider.status.last_probed_at


def _governs(snapshot: ClusterSnapshot, policy: CrewSchedulingPolicy, agent: Agent) -> bool:
    governing = snapshot.resolve_policy(agent).policy
    return governing is not None and governing.key == policy.key


def _body_of(resource: Resource) -> dict[str, Any]:
    return resource.to_manifest()


def _status_of(resource: Resource) -> dict[str, Any]:
    status = resource.to_manifest().get("status")
    return dict(status) if isinstance(status, Mapping) else {}


def _status_path(kind: str, body: Mapping[str, Any]) -> str:
    ref = ObjectRef.of(body, kind=kind)
    plural = RESOURCE_TYPES[kind].PLURAL
    return custom_path(plural, ref.name, namespace=ref.namespace, subresource="status")

