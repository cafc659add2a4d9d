"""The operator under test: kopf against kmock's Kubernetes emulator, real providers.

Facts about kopf 1.45 + kmock 0.8 this harness relies on: kmock must declare every
resource kopf discovers (``v1/namespaces`` and the CRDs) or kopf never watches; kopf's
resource scanning is off; objects are created only after every watch is open (else an
object is seen twice). Objects are written through kmock's HTTP API so that watch
events flow, exactly as an API server would send them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kmock
import kopf
import pytest
import yaml

from kubemoot.api import RESOURCE_TYPES, Resource, crd_manifests, parse_manifest
from kubemoot.api.errors import InputError
from kubemoot.clock import SystemClock
from kubemoot.emulation.server import EmulatedModel, EmulatorConfig, OllamaEmulator
from kubemoot.operator.kube import KubeClient, custom_path
from kubemoot.operator.rbac import crew_rbac
from kubemoot.operator.reconciler import Reconciler
from kubemoot.operator.run import kopf_settings, serve
from kubemoot.operator.view import INDEX_IDS
from kubemoot.runtime.builder import build_runtime
from kubemoot.settings import RuntimeSettings
from kubemoot.store.declared import MODEL_SIZES_BUCKET, DeclaredSize
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import Bucket
from kubemoot.testing.waiting import until_idle, wait_until

from ._rbac import allowed, grants

SMALL = EmulatedModel("phi3:mini", 2048)
MEDIUM = EmulatedModel("qwen3:8b", 5120)
LARGE = EmulatedModel("qwen3:14b", 9216)
DEADLINE = 30.0  # seconds before an awaited state counts as never reached
SETTLE_DEADLINE = 60.0  # seconds before a busy operator counts as never idle


def fast_emulator(**overrides: Any) -> OllamaEmulator:
    """An 16 GiB emulated card whose waits are a hundredth of the emulated seconds."""
    settings: dict[str, Any] = {
        "models": (SMALL, MEDIUM, LARGE), "vram_mib": 16384, "num_parallel": 1,
        "context_length": 4096, "load_rate_mibps": 100000.0, "time_scale": 0.01,
        "keep_alive_s": 30_000.0,
    }
    settings.update(overrides)
    return OllamaEmulator(EmulatorConfig(**settings)).start()


class Emulators:
    """Starts Ollama-API emulators on demand and stops them all at the end."""

    def __init__(self) -> None:
        self.started: list[OllamaEmulator] = []

    def __call__(self, **overrides: Any) -> OllamaEmulator:
        emulator = fast_emulator(**overrides)
        self.started.append(emulator)
        return emulator

    def at(self, url: str) -> OllamaEmulator:
        """The emulator serving ``url``."""
        return next(e for e in self.started if e.url == url)


@pytest.fixture
def emulators() -> Iterator[Emulators]:
    made = Emulators()
    yield made
    for emulator in made.started:
        emulator.stop()


def declare_resources(server: Any) -> None:
    """Discovery entries for what the operator watches and writes."""
    server.resources["v1/namespaces"] = kmock.ResourceInfo(
        kind="Namespace", namespaced=False, verbs={"list", "watch", "get"}
    )
    server.resources["v1/events"] = kmock.ResourceInfo(
        kind="Event", namespaced=True, verbs={"create", "list"}
    )
    server.resources["apps/v1/deployments"] = kmock.ResourceInfo(
        kind="Deployment", namespaced=True,
        verbs={"get", "list", "watch", "patch", "create", "delete"}
    )
    for crd in crd_manifests():
        spec = crd["spec"]
        names = spec["names"]
        server.resources[f"{spec['group']}/{spec['versions'][0]['name']}/{names['plural']}"] = (
            kmock.ResourceInfo(
                kind=names["kind"],
                singular=names["singular"],
                namespaced=spec["scope"] == "Namespaced",
                verbs={"list", "watch", "get", "patch", "create", "delete"},
                subresources={"status"},
            )
        )


@dataclass
class Cluster:
    """The emulated API server, a client on it, and the operator's reconciler."""

    server: Any
    http: httpx.AsyncClient
    reconciler: Reconciler
    bucket: Bucket
    operator: OperatorThread

    # -- writing like kubectl ------------------------------------------------------------

    async def apply(self, resource: Resource | dict[str, Any]) -> None:
        """Create one of our objects (a model or a manifest dict)."""
        body = resource.to_manifest() if isinstance(resource, Resource) else resource
        cls = RESOURCE_TYPES[body["kind"]]
        namespace = body["metadata"].get("namespace") if cls.NAMESPACED else None
        scope = f"/namespaces/{namespace}" if namespace else ""
        response = await self.http.post(f"/apis/kubemoot.ai/v1alpha1{scope}/{cls.PLURAL}",
                                        json=body)
        assert response.status_code < 300, response.text

    async def patch(self, kind: str, name: str, patch: dict[str, Any], *,
                    namespace: str | None = None, subresource: str | None = None) -> None:
        path = custom_path(RESOURCE_TYPES[kind].PLURAL, name, namespace=namespace,
                           subresource=subresource)
        response = await self.http.patch(
            path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )
        assert response.status_code < 300, response.text

    async def delete(self, kind: str, name: str, *, namespace: str | None = None) -> None:
        path = custom_path(RESOURCE_TYPES[kind].PLURAL, name, namespace=namespace)
        response = await self.http.delete(path)
        assert response.status_code < 300, response.text

    async def create_deployment(self, namespace: str, name: str, *,
                                env: list[dict[str, str]] | None = None) -> None:
        body = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": {"containers": [
                {"name": "sidecar", "image": "busybox"},
                {"name": "agent", "image": "agent:1", "env": env or [{"name": "KEEP",
                                                                       "value": "me"}]},
            ]}}},
        }
        response = await self.http.post(f"/apis/apps/v1/namespaces/{namespace}/deployments",
                                        json=body)
        assert response.status_code < 300, response.text

    async def reconcile(self, *agents: str) -> None:
        """Schedule Agents (``namespace/name``) again, in the operator's loop."""
        await self.operator.call(
            lambda: self.reconciler.reconcile_agents(set(agents), trigger="test")
        )

    async def kv_state(self, provider: str) -> ProviderState | None:
        entry = await self.operator.call(lambda: self.bucket.get(encode_token(provider)))
        return None if entry is None else ProviderState.from_json(entry.value)

    # -- reading ------------------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        cls = RESOURCE_TYPES[kind]
        key = (f"kubemoot.ai/v1alpha1/{cls.PLURAL}", namespace, name)
        return dict(self.server.objects[key].raw)

    def versions(self, kind: str, name: str, namespace: str | None = None) -> int:
        """How many versions the object has had (each write adds one)."""
        cls = RESOURCE_TYPES[kind]
        key = (f"kubemoot.ai/v1alpha1/{cls.PLURAL}", namespace, name)
        return len(self.server.objects[key].history)

    def deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.server.objects["apps/v1/deployments", namespace, name].raw)

    def events(self, *, reason: str | None = None) -> list[dict[str, Any]]:
        found = []
        for (resource, _, _), obj in list(self.server.objects.items()):
            if resource != kmock.resource("v1/events") or obj.deleted:
                continue
            if reason is None or obj.raw.get("reason") == reason:
                found.append(dict(obj.raw))
        return found

    def status(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        try:
            return dict(self.get(kind, name, namespace).get("status") or {})
        except (KeyError, ValueError):
            return {}

    def condition(self, kind: str, name: str, kind_of_condition: str,
                  namespace: str | None = None) -> dict[str, Any]:
        for item in self.status(kind, name, namespace).get("conditions") or []:
            if item.get("type") == kind_of_condition:
                return dict(item)
        return {}


async def eventually(check: Callable[[], Any], *, what: str = "condition") -> Any:
    """Look at ``check`` until it returns something truthy (fail after :data:`DEADLINE`).

    The operator runs in a thread and loop of its own and kmock records what it did;
    neither sends this loop an event, so this looks again at a short interval.
    """
    return await wait_until(check, timeout=DEADLINE, what=what,
                            ignoring=(KeyError, ValueError, AssertionError, TypeError))


def _observed_everything(cluster: Cluster) -> bool:
    """Whether the reconciler has observed every one of our objects as it is stored now.

    ``Reconciler.seen`` holds the last version of each object that reached the reconciler;
    an object whose stored form differs still has a watch event on its way. Objects that
    do not parse never enter ``seen`` and are left out.
    """
    for (resource, namespace, name), obj in list(cluster.server.objects.items()):
        if getattr(resource, "group", None) != "kubemoot.ai" or obj.deleted:
            continue
        try:
            stored = parse_manifest(dict(obj.raw))
        except InputError:
            continue
        seen = cluster.reconciler.seen.get(f"{stored.KIND}/{namespace or ''}/{name}")
        if seen is None or seen.to_manifest() != stored.to_manifest():
            return False
    return True


async def _through_the_lock(cluster: Cluster) -> None:
    """Wait for every scheduling pass that holds or awaits the reconciler's lock to end.

    ``reconcile_agents`` takes the lock even for a key that names no Agent, and asyncio's
    lock is first come, first served; waiting until the operator's loop has nothing
    ready first lets a task that has just observed an event reach the lock before this
    call does.
    """

    async def barrier() -> None:
        await until_idle()
        await cluster.reconciler.reconcile_agents({"kubemoot-test/no-such-agent"},
                                                  trigger="test-barrier")

    await cluster.operator.call(barrier)


async def settle(cluster: Cluster) -> None:
    """Wait until the operator is idle, judged by what it did, not by a quiet spell.

    Idle means: the reconciler has observed every object as stored, a pass through its
    lock completes, and across that pass the API server got no request at all, twice in
    a row. A slow machine makes this take longer; it cannot make it return early.
    """
    calm = 0

    async def idle_twice() -> bool:
        nonlocal calm
        before = len(list(cluster.server))
        if not _observed_everything(cluster):
            calm = 0
            return False
        await _through_the_lock(cluster)
        quiet = len(list(cluster.server)) == before and _observed_everything(cluster)
        calm = calm + 1 if quiet else 0
        return calm >= 2

    await wait_until(idle_twice, timeout=SETTLE_DEADLINE, what="the operator becoming idle")


async def _watches_open(server: Any) -> None:
    # every kind the operator reconciles (ModelClass is the gateways', not watched)
    wanted = {RESOURCE_TYPES[kind].PLURAL for kind in INDEX_IDS}

    def opened() -> bool:
        seen = {
            request.resource.plural
            for request in list(server)
            if request.action == kmock.action.WATCH and request.resource is not None
        }
        return wanted <= seen

    await eventually(opened, what="kopf opening every watch")


class OperatorThread:
    """The operator in a thread and event loop of its own.

    kopf cancels every task of its loop that it did not start when it stops; in the
    test's loop that would include pytest's own fixture tasks, so the operator gets a
    loop to itself (as ``kopf.testing.KopfRunner`` does) and talks to kmock over HTTP.
    """

    def __init__(self, server_url: str, *, liveness_endpoint: str | None = None,
                 left_sizes: Mapping[str, int] | None = None) -> None:
        self.server_url = server_url
        self.liveness_endpoint = liveness_endpoint
        #: declared sizes an earlier run left in the shared state before this one starts
        self.left_sizes = dict(left_sizes or {})
        self.loop = asyncio.new_event_loop()
        self.reconciler: Reconciler | None = None
        self.bucket: Bucket | None = None
        self.sizes: Bucket | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubemoot-operator", daemon=True)
        self.error: BaseException | None = None

    async def _login(self) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=self.server_url, insecure=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as error:  # surfaced by stop()
            self.error = error
        finally:
            self._started.set()
            self.loop.close()

    async def _main(self) -> None:
        clock = SystemClock()
        store = MemoryKV(clock)
        self.bucket = await store.bucket(PROVIDER_STATE_BUCKET)
        self.sizes = await store.bucket(MODEL_SIZES_BUCKET)
        for model, mib in self.left_sizes.items():
            await self.sizes.put(encode_token(model),
                                 DeclaredSize(model=model, vram_mib=mib).to_json())
        self.reconciler = Reconciler(KubeClient(self._login), clock=clock, bucket=self.bucket,
                                     sizes=self.sizes, probe_interval=3600.0,
                                     probe_timeout=5.0)
        # as run_operator wires it: pinned loads are calls of a runtime over the clients
        self.reconciler.runtime = await build_runtime(
            store, clock=clock, clients=self.reconciler.clients,
            settings=RuntimeSettings().with_values({"load_rate_mibps": 100000.0}))
        self._stop = asyncio.Event()
        self._started.set()
        try:
            settings = kopf_settings()
            # kopf waits for idle per-object workers when it stops; keep that short.
            settings.queueing.idle_timeout = 0.2
            await serve(self.reconciler, login=self._login, stop=self._stop, settings=settings,
                        liveness_endpoint=self.liveness_endpoint)
        finally:
            await store.close()


    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    async def call(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Run a coroutine in the operator's loop and wait for its result."""
        future = asyncio.run_coroutine_threadsafe(make(), self.loop)
        return await asyncio.wrap_future(future)

    async def stop(self) -> None:
        if self._stop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join, DEADLINE)
        assert not self._thread.is_alive(), "the operator did not stop"
        if self.error is not None:
            raise self.error


@pytest.fixture
async def cluster(kmock: Any) -> AsyncIterator[Cluster]:
    declare_resources(kmock)
    server_url = str(kmock.url).rstrip("/")
    operator = OperatorThread(server_url)
    operator.start()
    try:
        await _watches_open(kmock)
        assert operator.reconciler is not None and operator.bucket is not None
        async with httpx.AsyncClient(base_url=server_url,
                                     headers={"User-Agent": TEST_CLIENT}) as http:
            yield Cluster(kmock, http, operator.reconciler, operator.bucket, operator)
    finally:
        await operator.stop()
    assert_rbac_allows_every_request(kmock)


TEST_CLIENT = "kubemoot-tests"  # the User-Agent of the test's own writes
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_VERBS = {
    kmock.action.LIST: "list", kmock.action.WATCH: "watch", kmock.action.FETCH: "get",
    kmock.action.CREATE: "create", kmock.action.DELETE: "delete",
}


def operator_requests(server: Any) -> list[Any]:
    """Every API request the operator (kopf and its own client) sent, not the test's."""
    return [r for r in list(server) if r.headers.get("User-Agent") != TEST_CLIENT]


def assert_rbac_allows_every_request(server: Any) -> None:
    """Each request the operator made is allowed by deploy/base/rbac.yaml plus a crew Role
    (``kubemoot crew-rbac``) in every namespace that held Agents, as installed for real."""
    crews = {
        namespace for (resource, namespace, _), _obj in list(server.objects.items())
        if getattr(resource, "plural", None) == "agents" and namespace
    }
    docs = [d for d in yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text()) if d]
    for namespace in sorted(crews):
        docs += crew_rbac(namespace)
    granted = grants(docs)
    denied = []
    for request in operator_requests(server):
        if request.resource is None or request.resource.plural is None:
            # discovery (/api, /apis/GROUP/VERSION …): open to every account
            assert request.method == "GET", request
            continue
        verb = _VERBS.get(request.action) or ("patch" if request.method == "PATCH" else "update")
        plural = request.resource.plural + (f"/{request.subresource}" if request.subresource
                                            else "")
        if not allowed(granted, verb=verb, group=request.resource.group or "",
                       resource=plural, namespace=request.namespace):
            denied.append(f"{verb} {request.resource.group or 'core'}/{plural} "
                          f"in {request.namespace or 'the cluster'}")
    assert not denied, f"RBAC denies requests the operator made: {sorted(set(denied))}"
