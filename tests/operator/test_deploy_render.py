"""The overlays as `kubectl kustomize` renders them: what a cluster needs to start.

Every Secret and ConfigMap a workload reads exists in the render (dev: always; prod:
or docs/operator.md's "Secrets" section says to create it); every dev ModelProvider
points at a Service of the render; every container has a readiness and a liveness
probe; every Service port lands on a container port of the pods it selects; and the
image the manifests name is the one the root Dockerfile's build command makes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from .test_operator_deploy import DEPLOY, render

ROOT = DEPLOY.parent
OVERLAYS = ["dev", "prod", "prod-tls"]
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}
IMAGE = "ghcr.io/kubemoot/kubemoot:0.1.0"


def workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (d for d in docs if d["kind"] in WORKLOADS)


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return list(workload["spec"]["template"]["spec"]["containers"])


def references(workload: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of every Secret and ConfigMap the pod template reads."""
    pod = workload["spec"]["template"]["spec"]
    found: set[tuple[str, str]] = set()
    for container in pod.get("initContainers", []) + pod["containers"]:
        for item in container.get("env", []):
            source = item.get("valueFrom", {})
            if "secretKeyRef" in source:
                found.add(("Secret", source["secretKeyRef"]["name"]))
            if "configMapKeyRef" in source:
                found.add(("ConfigMap", source["configMapKeyRef"]["name"]))
        for item in container.get("envFrom", []):
            if "secretRef" in item:
                found.add(("Secret", item["secretRef"]["name"]))
            if "configMapRef" in item:
                found.add(("ConfigMap", item["configMapRef"]["name"]))
    for volume in pod.get("volumes", []):
        if "secret" in volume:
            found.add(("Secret", volume["secret"]["secretName"]))
        if "configMap" in volume:
            found.add(("ConfigMap", volume["configMap"]["name"]))
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                found.add(("Secret", source["secret"]["name"]))
            if "configMap" in source:
                found.add(("ConfigMap", source["configMap"]["name"]))
    return found


def documented_secrets() -> str:
    """docs/operator.md's "Secrets" section: what a cluster creates by hand."""
    text = (ROOT / "docs" / "operator.md").read_text(encoding="utf-8")
    match = re.search(r"^## Secrets\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert match, "docs/operator.md has no '## Secrets' section"
    return match.group(1)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_and_config_map_read_exists_or_is_documented(overlay: str) -> None:
    docs = render(overlay)
    present = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
               for d in docs if d["kind"] in ("Secret", "ConfigMap")}
    documented = documented_secrets()
    missing = []
    for workload in workloads(docs):
        namespace = workload["metadata"]["namespace"]
        for kind, name in sorted(references(workload)):
            if (kind, namespace, name) in present:
                continue
            # dev must start with nothing made by hand; elsewhere the doc must say how
            if overlay == "dev" or f"`{name}`" not in documented:
                missing.append(f"{workload['metadata']['name']} reads {kind} "
                               f"{namespace}/{name}")
    assert not missing, missing


def test_dev_needs_no_secret_made_by_hand() -> None:
    docs = render("dev")
    secrets = {(d["metadata"]["namespace"], d["metadata"]["name"])
               for d in docs if d["kind"] == "Secret"}
    crews = {d["metadata"]["namespace"] for d in docs if d["kind"] == "Agent"}
    assert {("kubemoot-system", "kubemoot-nats"),
            ("kubemoot-system", "kubemoot-gateway-api-keys")} <= secrets
    assert {(crew, "kubemoot-nats") for crew in crews} <= secrets


def test_every_dev_model_provider_is_a_service_of_the_render() -> None:
    docs = render("dev")
    services = {(d["metadata"]["name"], d["metadata"]["namespace"]):
                {p["port"] for p in d["spec"]["ports"]}
                for d in docs if d["kind"] == "Service"}
    providers = [d for d in docs if d["kind"] == "ModelProvider"]
    assert len(providers) >= 2  # two cards: the runtime has a choice to make
    for provider in providers:
        url = urlsplit(provider["spec"]["endpoint"])
        assert url.hostname is not None and url.port is not None, provider["spec"]
        name, namespace, *rest = url.hostname.split(".")
        assert rest in (["svc"], ["svc", "cluster", "local"]), url.hostname
        assert url.port in services.get((name, namespace), set()), (
            f"ModelProvider {provider['metadata']['name']} points at {url.hostname}:"
            f"{url.port}, which is no Service port of the render")


def test_dev_models_fit_the_emulated_cards_that_serve_them() -> None:
    """Each dev Model is in its emulator's catalogue at its declared size."""
    docs = render("dev")
    catalogue: dict[str, dict[str, int]] = {}
    for workload in workloads(docs):
        for container in containers(workload):
            args = container.get("args", [])
            if args[:1] == ["emulate-ollama"]:
                models = [args[i + 1] for i, a in enumerate(args) if a == "--model"]
                catalogue[workload["metadata"]["name"]] = {
                    m.split("=")[0]: int(m.split("=")[1]) for m in models}
    providers = {d["metadata"]["name"]: urlsplit(d["spec"]["endpoint"]).hostname
                 for d in docs if d["kind"] == "ModelProvider"}
    for model in (d for d in docs if d["kind"] == "Model"):
        spec = model["spec"]
        service = str(providers[spec["providerRef"]]).split(".")[0]
        assert catalogue[service][spec["model"]] == spec["vramMib"], model["metadata"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_readiness_and_liveness_probes(overlay: str) -> None:
    lacking = [
        f"{w['kind']} {w['metadata']['namespace']}/{w['metadata']['name']} "
        f"container {c['name']} lacks {probe}"
        for w in workloads(render(overlay)) for c in containers(w)
        for probe in ("readinessProbe", "livenessProbe") if probe not in c
    ]
    assert not lacking, lacking


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_targets_a_container_port_of_its_pods(overlay: str) -> None:
    docs = render(overlay)
    pods = [(w["metadata"]["namespace"], w["spec"]["template"]["metadata"]["labels"],
             containers(w)) for w in workloads(docs)]
    wrong = []
    for service in (d for d in docs if d["kind"] == "Service"):
        namespace = service["metadata"]["namespace"]
        selector = service["spec"].get("selector") or {}
        selected = [cs for ns, labels, cs in pods
                    if ns == namespace and selector and selector.items() <= labels.items()]
        if not selected:
            wrong.append(f"Service {service['metadata']['name']} selects no pod")
            continue
        ports = {key for cs in selected for c in cs for p in c.get("ports", [])
                 for key in (p.get("name"), p["containerPort"])}
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if target not in ports:
                wrong.append(f"Service {service['metadata']['name']} port {port['port']} "
                             f"targets {target!r}, no container port of its pods")
    assert not wrong, wrong


def test_the_root_dockerfile_builds_the_image_the_manifests_name() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert not (DEPLOY / "Dockerfile").exists(), "one Dockerfile, at the root"
    assert f"docker build -t {IMAGE} ." in dockerfile
    images = {c["image"] for overlay in OVERLAYS for w in workloads(render(overlay))
              for c in containers(w) if "kubemoot" in c["image"]}
    assert images == {IMAGE}
    guide = (ROOT / "docs" / "operator.md").read_text(encoding="utf-8")
    assert f"docker build -t {IMAGE} ." in guide
    assert f"kind load docker-image {IMAGE}" in guide


def test_the_crds_are_their_own_kustomization_and_the_overlays_leave_them_out() -> None:
    crds = render_path(DEPLOY / "crds")
    assert crds and {d["kind"] for d in crds} == {"CustomResourceDefinition"}
    for overlay in OVERLAYS:
        assert not [d for d in render(overlay) if d["kind"] == "CustomResourceDefinition"]


def render_path(path: Path) -> list[dict[str, Any]]:
    import subprocess

    import yaml

    from tests.ci import kubectl

    done = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


#: Our web servers that answer only to Host names they know (kubemoot.webguard).
HOST_GUARDED = {"dashboard", "gateway"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_host_guarded_servers_answer_to_the_names_of_their_services(overlay: str) -> None:
    """A client in the cluster reaches a Service by its DNS name (Open WebUI at
    ``kubemoot-gateway.kubemoot-system.svc``); a server whose Host guard does not know
    that name refuses every such request with 403, so each name must be allowed."""
    docs = render(overlay)
    pods = [(w["metadata"]["namespace"], w["spec"]["template"]["metadata"]["labels"], c)
            for w in workloads(docs) for c in containers(w)
            if (c.get("args") or [""])[0] in HOST_GUARDED and "kubemoot" in c["image"]]
    assert {c["args"][0] for _, _, c in pods} == HOST_GUARDED
    refused = []
    for service in (d for d in docs if d["kind"] == "Service"):
        name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
        selector = service["spec"].get("selector") or {}
        for ns, labels, container in pods:
            if ns != namespace or not selector or not selector.items() <= labels.items():
                continue
            args = container["args"]
            allowed = {args[i + 1] for i, a in enumerate(args[:-1]) if a == "--allow-host"}
            for host in (name, f"{name}.{namespace}.svc"):
                if host not in allowed:
                    refused.append(f"{container['args'][0]} behind Service {name} "
                                   f"refuses Host {host}")
    assert not refused, refused
