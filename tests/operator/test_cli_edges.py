"""A broken kubeconfig stops ``kubemoot operator`` with one line naming the file (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubemoot.operator.kube import kubeconfig_paths

KUBEMOOT = Path(sys.executable).with_name("kubemoot")
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()


def operator(kubeconfig: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEMOOT_NATS")}
    env.update(HOME=str(home), KUBECONFIG=kubeconfig)
    return subprocess.run([str(KUBEMOOT), "operator", "--embedded"], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


@pytest.mark.skipif(IN_CLUSTER, reason="a service account wins over KUBECONFIG")
@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"apiVersion: v1\nclusters: [\n  - foo: {\n", "YAML syntax error at line 3"),
        (b"- just\n- a list\n", "a kubeconfig must be a mapping"),
        (b"\xff\xfe binary", "not UTF-8 text"),
        (b"clusters: {name: k}\n", "clusters must be a list"),
        (b"users: [{user: {token: t}}]\n", "users[0] needs a name"),
        (b"current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n",
         "no entry named 'k'"),
        (b"clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n",
         "Current context is not set"),
    ],
)
def test_a_malformed_kubeconfig_is_bad_input(tmp_path: Path, content: bytes,
                                              problem: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_bytes(content)
    done = operator(str(config), tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"cannot read Kubernetes credentials from {config}: {problem}" in done.stderr
    assert "Traceback" not in done.stderr and "ParserError" not in done.stderr


@pytest.mark.skipif(IN_CLUSTER, reason="a service account wins over KUBECONFIG")
def test_a_missing_kubeconfig_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    done = operator(str(missing), tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"cannot read Kubernetes credentials from {missing}: No such file" in done.stderr


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"KUBECONFIG": "/a.yaml"}, ["/a.yaml"]),
        ({"KUBECONFIG": f"/a.yaml{os.pathsep} {os.pathsep}/b.yaml"}, ["/a.yaml", "/b.yaml"]),
    ],
)
def test_kubeconfig_paths_follow_the_variable(environ: dict[str, str],
                                              expected: list[str]) -> None:
    assert kubeconfig_paths(environ) == expected
