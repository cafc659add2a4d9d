"""deploy/crew: a Deployment per Agent running `kubemoot agent`, the same on every
overlay; dev and prod differ only in the Model bundle and infrastructure sizing."""

from __future__ import annotations

from typing import Any

from tests.operator.test_operator_deploy import render

NS = "crew-homelab-pilot"
#: What may differ between overlays besides the Model bundle: sizing of the
#: infrastructure (the operator's probe interval, NATS storage).
SIZING = {("Deployment", "kubemoot-system", "kubemoot-operator"),
          ("StatefulSet", "kubemoot-system", "nats"),
          ("ConfigMap", "kubemoot-system", "nats-config")}  # prod: a three-node cluster
BUNDLE = {"Model", "ModelProvider"}
#: What dev adds for a cluster with no GPU and nothing made by hand: the emulated GPUs
#: that serve its bundle, and the Secrets a real cluster creates itself.
DEV_ONLY = {("Deployment", "kubemoot-system", "emulated-gpu-a"),
            ("Service", "kubemoot-system", "emulated-gpu-a"),
            ("Deployment", "kubemoot-system", "emulated-gpu-b"),
            ("Service", "kubemoot-system", "emulated-gpu-b"),
            ("Secret", "kubemoot-system", "kubemoot-nats"),
            ("Secret", NS, "kubemoot-nats"),
            ("Secret", "kubemoot-system", "kubemoot-gateway-api-keys")}


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    meta = doc["metadata"]
    return doc["kind"], meta.get("namespace", ""), meta["name"]


def test_every_agent_has_a_deployment_running_kubemoot_agent() -> None:
    docs = render("prod")
    operator = next(d for d in docs if _key(d) == ("Deployment", "kubemoot-system",
                                                     "kubemoot-operator"))
    image = operator["spec"]["template"]["spec"]["containers"][0]["image"]
    agents = [d for d in docs if d["kind"] == "Agent"]
    deployments = {d["metadata"]["name"]: d for d in docs
                   if d["kind"] == "Deployment" and d["metadata"]["namespace"] == NS}
    assert sorted(deployments) == sorted(a["metadata"]["name"] for a in agents)
    for agent in agents:
        name = agent["metadata"]["name"]
        deployment = deployments[name]
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == "agent"  # the container the operator patches
        assert container["image"] == image  # the project's one image
        assert container["args"] == ["agent"]
        env = {e["name"]: e for e in container["env"]}
        assert env["KUBEMOOT_AGENT_NAME"]["value"] == name
        assert env["KUBEMOOT_AGENT_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.namespace"
        assert env["KUBEMOOT_CREW"]["value"] == agent["metadata"]["labels"]["kubemoot.ai/crew"]
        assert env["KUBEMOOT_AGENT_ROLE"]["value"] == agent["spec"]["discussRole"]
        assert env["KUBEMOOT_NATS_URL"]["value"].startswith("nats://nats.kubemoot-system")
        assert not any(k.startswith("KUBEMOOT_MODEL") for k in env)  # the operator's part
        # NATS refuses anonymous clients: the Pod waits for the credentials' Secret
        assert container["envFrom"] == [{"secretRef": {"name": "kubemoot-nats"}}]
        assert pod["automountServiceAccountToken"] is False  # no Kubernetes API access
        assert pod["securityContext"]["runAsNonRoot"] is True
        # The NetworkPolicy admits only labelled pods to NATS.
        assert deployment["spec"]["template"]["metadata"]["labels"][
            "kubemoot.ai/nats-client"] == "true"
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_dev_differs_from_prod_only_in_the_bundle_and_sizing() -> None:
    dev = {_key(d): d for d in render("dev") if d["kind"] not in BUNDLE}
    prod = {_key(d): d for d in render("prod") if d["kind"] not in BUNDLE}
    assert dev.keys() - prod.keys() == DEV_ONLY
    assert prod.keys() <= dev.keys()
    differing = {key for key in prod if dev[key] != prod[key]}
    assert differing <= SIZING, differing
    crew = [key for key in dev if key[1] == NS]
    assert {"Agent", "CrewSchedulingPolicy", "Deployment"} <= {k[0] for k in crew}
