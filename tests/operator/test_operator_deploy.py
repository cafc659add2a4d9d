"""deploy/: the checked-in CRDs, the kustomize overlays and what they install."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kubemoot.api import (
    Bundle,
    MootArchetype,
    crd_manifests,
    parse_manifest,
    validate_against_crd,
)
from kubemoot.cli import app
from kubemoot.gates import Outcome
from kubemoot.operator.probe import VRAM_TOTAL_ANNOTATION
from kubemoot.operator.rbac import crew_rbac, crew_rbac_yaml
from kubemoot.scheduling.archetypes import CONSENT_3
from kubemoot.scheduling.scheduler import schedule_bundle
from tests.ci import kubectl

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OVERLAYS = ["dev", "prod", "prod-tls"]
NOW = datetime(2026, 5, 15, 12, 0, tzinfo=UTC)


def render(overlay: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def ours(docs: list[dict[str, Any]], kind: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs
        if str(d.get("apiVersion", "")).startswith("kubemoot.ai/")
        and (kind is None or d["kind"] == kind)
    ]


def test_operator_checked_in_crds_equal_kubemoot_crds_output() -> None:
    result = CliRunner().invoke(app, ["crds"])
    assert result.exit_code == 0, result.output
    checked_in = (DEPLOY / "crds" / "crds.yaml").read_text(encoding="utf-8")
    assert checked_in == result.stdout, (
        "deploy/crds/crds.yaml is stale: run kubemoot crds > deploy/crds/crds.yaml"
    )
    assert list(yaml.safe_load_all(checked_in)) == crd_manifests()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_overlay_renders_and_every_custom_resource_validates(overlay: str) -> None:
    docs = render(overlay)
    # The CRDs are applied first from deploy/crds (test_deploy_render checks that);
    # what the overlay installs must validate against them.
    assert not [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    resources = ours(docs)
    assert resources, "the overlay installs no custom resources"
    for doc in resources:
        assert validate_against_crd(doc) == [], doc["metadata"]["name"]
        parse_manifest(doc)  # label syntax, selector operators: what the schema cannot say
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "kubemoot-operator") in kinds
    assert ("StatefulSet", "nats") in kinds
    assert ("MootArchetype", "consent-3") in kinds


def test_operator_overlays_share_identical_agents_and_policy() -> None:
    dev, prod = render("dev"), render("prod")
    for kind in ("Agent", "CrewSchedulingPolicy"):
        assert ours(dev, kind) == ours(prod, kind), kind
        assert ours(dev, kind)
    assert ours(dev, "Model") != ours(prod, "Model")


def test_operator_dev_bundle_is_two_emulated_cards_and_prod_is_multi_gpu_qwen3() -> None:
    dev = render("dev")
    dev_models = ours(dev, "Model")
    # the same two models on each emulated card: the runtime has a choice every call
    assert len({m["spec"]["providerRef"] for m in dev_models}) == 2
    by_provider: dict[str, set[str]] = {}
    for m in dev_models:
        by_provider.setdefault(m["spec"]["providerRef"], set()).add(m["spec"]["model"])
    assert set(map(frozenset, by_provider.values())) == {frozenset({"phi3:mini", "qwen3:8b"})}
    assert all(m["spec"]["vramMib"] > 0 for m in dev_models)
    prod = render("prod")
    prod_models = ours(prod, "Model")
    assert {m["metadata"]["labels"]["family"] for m in prod_models} == {"qwen3"}
    assert len({m["spec"]["providerRef"] for m in prod_models}) >= 2
    assert len(ours(prod, "ModelProvider")) >= 2


def _probed(provider: dict[str, Any]) -> dict[str, Any]:
    """The provider as a successful probe would leave it (ready, its declared total)."""
    total = int(provider["metadata"]["annotations"][VRAM_TOTAL_ANNOTATION])
    return {**provider, "status": {"ready": True, "capacity": {
        "vramTotalMiB": total, "vramUsedMiB": 0,
        "maxParallel": provider["spec"].get("numParallel", 1), "agentCount": 0,
    }}}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_crew_schedules_unchanged_on_every_overlay(overlay: str) -> None:
    bundle = Bundle()
    for doc in ours(render(overlay)):
        if doc["kind"] == "ModelProvider":
            doc = _probed(doc)
        bundle.add(parse_manifest(doc))
    result = schedule_bundle(bundle, now=NOW)
    assert {a.name for a in result.agents} == {"coordinator", "kubectl-agent", "log-analyst"}
    for agent in result.agents:
        assert {p.outcome for p in agent.phases.values()} == {Outcome.PLACE}, agent.name
        assert agent.env["KUBEMOOT_MODEL_MODEL"]
    assert not result.events


def test_operator_rbac_is_least_privilege() -> None:
    docs = render("dev")
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    rules = role["rules"]
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"]
    granted = {
        (group, resource, verb)
        for rule in rules for group in rule["apiGroups"]
        for resource in rule["resources"] for verb in rule["verbs"]
    }
    assert {verb for group, resource, verb in granted if group == "kubemoot.ai"
            and "/" not in resource} == {"get", "list", "watch"}
    assert {verb for _, resource, verb in granted if resource.endswith("/status")} == {"patch"}
    assert not any(resource == "deployments" for _, resource, _ in granted)
    assert {(r, v) for g, r, v in granted if g == ""} == {("events", "create")}
    crew_roles = [d for d in docs if d["kind"] == "Role"]
    assert [(r["metadata"]["namespace"], r["rules"]) for r in crew_roles] == [
        ("crew-homelab-pilot", crew_rbac("crew-homelab-pilot")[0]["rules"])]
    assert not any(r in ("secrets", "pods", "customresourcedefinitions") for _, r, _ in granted)


def test_operator_base_archetype_is_the_builtin_consent_3() -> None:
    docs = render("dev")
    archetype = parse_manifest(ours(docs, "MootArchetype")[0])
    assert isinstance(archetype, MootArchetype)
    assert archetype.spec == CONSENT_3.spec


def test_operator_checked_in_crew_rbac_equals_kubemoot_crew_rbac_output() -> None:
    result = CliRunner().invoke(app, ["crew-rbac", "crew-homelab-pilot"])
    assert result.exit_code == 0, result.output
    checked_in = (DEPLOY / "crew" / "rbac.yaml").read_text(encoding="utf-8")
    assert checked_in == result.stdout == crew_rbac_yaml(["crew-homelab-pilot"]), (
        "deploy/crew/rbac.yaml is stale: run kubemoot crew-rbac crew-homelab-pilot"
    )
    kustomization = yaml.safe_load((DEPLOY / "crew" / "kustomization.yaml").read_text())
    assert "rbac.yaml" in kustomization["resources"]


def test_operator_rbac_grants_deployments_only_per_crew_namespace() -> None:
    """Read without kustomize: the base grants nothing on Deployments, the crew Role does."""
    from ._rbac import allowed, grants

    docs = [d for path in (DEPLOY / "base" / "rbac.yaml", DEPLOY / "crew" / "rbac.yaml")
            for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    for doc in docs:
        for rule in doc.get("rules") or []:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], doc["metadata"]["name"]
            assert "resourceNames" not in rule
    granted = grants(docs)
    for verb in ("get", "watch", "patch"):
        assert allowed(granted, verb=verb, group="apps", resource="deployments",
                       namespace="crew-homelab-pilot")
        assert not allowed(granted, verb=verb, group="apps", resource="deployments",
                           namespace="kube-system")
    for verb in ("list", "create", "delete", "update"):
        assert not allowed(granted, verb=verb, group="apps", resource="deployments",
                           namespace="crew-homelab-pilot")
    assert not allowed(granted, verb="get", group="", resource="secrets",
                       namespace="crew-homelab-pilot")


def test_operator_crew_rbac_refuses_a_bad_namespace() -> None:
    from kubemoot.api.errors import InputError

    result = CliRunner().invoke(app, ["crew-rbac", "Crew_A"])
    assert isinstance(result.exception, InputError)
    assert "NAMESPACE" in result.exception.describe()


def test_operator_crds_follow_the_api_conventions() -> None:
    for crd in crd_manifests():
        version = crd["spec"]["versions"][0]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        conditions = status["conditions"]
        assert conditions["x-kubernetes-list-type"] == "map", crd["metadata"]["name"]
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        assert "type" in conditions["items"]["required"]
        assert "observedGeneration" in status
        for column in version["additionalPrinterColumns"]:
            # kubectl prints only the first item of a [*] path: such a column would lie.
            assert "[*]" not in column["jsonPath"], (crd["metadata"]["name"], column)


def _by(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _nats_conf(docs: list[dict[str, Any]]) -> str:
    return str(_by(docs, "ConfigMap", "nats-config")["data"]["nats.conf"])


def _local_conf(conf: str, store: Path, port: int) -> str:
    """The cluster's nats.conf, moved onto loopback and a temporary store."""
    text = conf.replace("listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{port}")
    text = text.replace("http: 0.0.0.0:8222\n", "")
    return text.replace("store_dir: /data", f"store_dir: {store}")


@pytest.mark.nats
async def test_operator_nats_refuses_clients_without_the_secrets_credentials(
    tmp_path: Path,
) -> None:
    """The base's nats.conf, run by a real nats-server: anonymous clients are refused."""

    from kubemoot.settings import NatsSettings
    from kubemoot.store.nats import NatsKV
    from kubemoot.store.protocol import StoreUnavailable
    from kubemoot.testing.nats_server import find_nats_server, free_port, until_listening

    docs = render("dev")
    statefulset = _by(docs, "StatefulSet", "nats")
    env = {e["name"]: e["valueFrom"]["secretKeyRef"]
           for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]
           if "secretKeyRef" in e.get("valueFrom", {})}
    assert env == {
        "NATS_USER": {"name": "kubemoot-nats", "key": "KUBEMOOT_NATS_USER"},
        "NATS_PASSWORD": {"name": "kubemoot-nats", "key": "KUBEMOOT_NATS_PASSWORD"},
    }
    port = free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(_local_conf(_nats_conf(docs), tmp_path, port))
    log_path = tmp_path / "server.log"
    with log_path.open("ab") as log:
        server = subprocess.Popen(
            [find_nats_server(), "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT,
            env={"NATS_USER": "kubemoot", "NATS_PASSWORD": "s3cr3t-for-the-test"},
        )
    try:
        url = f"nats://127.0.0.1:{port}"
        await until_listening(server, port, log_path, timeout=20)
        with pytest.raises(StoreUnavailable):
            await NatsKV.connect(NatsSettings(servers=[url], max_reconnect_attempts=1))
        with pytest.raises(StoreUnavailable, match="refused the credentials"):
            await NatsKV.connect(NatsSettings(servers=[url], user="kubemoot",
                                              password="wrong", max_reconnect_attempts=1))
        kv = await NatsKV.connect(NatsSettings(servers=[url], user="kubemoot",
                                               password="s3cr3t-for-the-test"))
        try:
            bucket = await kv.bucket("kubemoot_provider_state")
            await bucket.put("k", b"v")
        finally:
            await kv.close()
    finally:
        server.kill()
        server.wait()


def test_operator_reads_the_nats_secret_and_may_reach_nats() -> None:
    docs = render("dev")
    operator = _by(docs, "Deployment", "kubemoot-operator")
    pod = operator["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "kubemoot-nats"}}]  # required
    assert pod["metadata"]["labels"]["kubemoot.ai/nats-client"] == "true"
    crew_namespace = next(d for d in docs if d["kind"] == "Namespace"
                          and d["metadata"]["name"] == "crew-homelab-pilot")
    assert crew_namespace["metadata"]["labels"]["kubemoot.ai/crew-namespace"] == "true"


def test_operator_network_policies_admit_only_kubemoot_components() -> None:
    docs = render("dev")
    nats = _by(docs, "NetworkPolicy", "nats-clients")
    assert nats["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "nats"}}
    assert nats["spec"]["policyTypes"] == ["Ingress"]
    client, routes = nats["spec"]["ingress"]
    assert client["ports"] == [{"port": 4222, "protocol": "TCP"}]
    for peer in client["from"]:  # never a bare namespace or an empty selector
        assert peer["podSelector"] == {"matchLabels": {"kubemoot.ai/nats-client": "true"}}
        assert peer["namespaceSelector"]["matchLabels"]
    assert routes["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "nats"}}}]
    metrics = _by(docs, "NetworkPolicy", "operator-metrics")
    assert metrics["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "kubemoot-operator"}}
    rule, health = metrics["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert all(peer["podSelector"]["matchLabels"] == {"kubemoot.ai/metrics-scraper": "true"}
               for peer in rule["from"])
    # the health port is open to the kubelet's probes, and it is the only open one
    assert health == {"ports": [{"port": 8081, "protocol": "TCP"}]}


@pytest.mark.nats
def test_operator_prod_runs_a_three_node_cluster_with_three_replicas(tmp_path: Path) -> None:
    from kubemoot.testing.nats_server import find_nats_server

    docs = render("prod")
    assert _by(docs, "StatefulSet", "nats")["spec"]["replicas"] == 3
    conf = _nats_conf(docs)
    for node in range(3):
        assert f"nats://nats-{node}.nats-headless.kubemoot-system.svc:6222" in conf
    env = _by(docs, "Deployment", "kubemoot-operator")["spec"]["template"]["spec"][
        "containers"][0]["env"]
    assert {"name": "KUBEMOOT_NATS_REPLICAS", "value": "3"} in env
    # The real server parses it (-t: test the configuration and exit).
    path = tmp_path / "nats.conf"
    path.write_text(_local_conf(conf, tmp_path, 4222))
    checked = subprocess.run(
        [find_nats_server(), "--config", str(path), "-t"], capture_output=True, text=True,
        env={"NATS_USER": "u", "NATS_PASSWORD": "p", "POD_NAME": "nats-0"}, timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_operator_tls_overlay_turns_tls_on_for_server_and_operator() -> None:
    docs = render("prod-tls")
    args = _by(docs, "StatefulSet", "nats")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tls" in args and "--tlscert=/etc/nats-tls/tls.crt" in args
    container = _by(docs, "Deployment", "kubemoot-operator")["spec"]["template"]["spec"][
        "containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KUBEMOOT_NATS_URL"].startswith("tls://")
    assert env["KUBEMOOT_NATS_TLS_CA"] == "/etc/nats-tls/ca.crt"
    assert env["KUBEMOOT_NATS_REPLICAS"] == "3"  # still the prod cluster underneath


def test_operator_tls_overlay_turns_tls_on_for_every_nats_client() -> None:
    """The server speaks only TLS: a client left on nats:// could never connect."""
    docs = render("prod-tls")
    clients = [d for d in docs if d["kind"] == "Deployment" and d["spec"]["template"][
        "metadata"]["labels"].get("kubemoot.ai/nats-client") == "true"]
    assert {d["metadata"]["name"] for d in clients} >= {
        "kubemoot-operator", "coordinator", "kubectl-agent", "log-analyst"}
    for deployment in clients:
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        name = deployment["metadata"]["name"]
        assert env["KUBEMOOT_NATS_URL"] == "tls://nats.kubemoot-system.svc:4222", name
        mount = next(m for m in container["volumeMounts"] if m["name"] == "nats-tls")
        assert env["KUBEMOOT_NATS_TLS_CA"] == f"{mount['mountPath']}/ca.crt", name
        volume = next(v for v in pod["volumes"] if v["name"] == "nats-tls")
        # the Secret of the pod's own namespace (a copy in each crew's namespace)
        assert volume["secret"]["secretName"] == "kubemoot-nats-tls", name
