"""``kubemoot operator``: bad invocations end with exit status 2 and one line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

KUBEMOOT = Path(sys.executable).with_name("kubemoot")
# Credentials that load, for a cluster that is not there.
KUBECONFIG = (
    "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
    "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
    "users: [{name: u, user: {token: t}}]\n"
)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBEMOOT), "operator", *args], capture_output=True, text=True,
                          timeout=60, env=env, check=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no shared store"),
        (("--nats", "nats://x:4222", "--embedded"), "not both"),
        (("--embedded", "-n", "crew-a", "--all-namespaces"), "not both"),
        (("--nats", "http://x:4222"), "not a NATS URL"),
    ],
)
def test_operator_cli_rejects_bad_options(args: tuple[str, ...], message: str,
                                          tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEMOOT_NATS")}
    env.update(HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "config"))
    (tmp_path / "config").write_text(KUBECONFIG)
    done = run(*args, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert message in done.stderr


def test_operator_cli_without_credentials_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)
    done = run("--embedded", env=env)
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("running inside a cluster: a service account is available")
    assert done.returncode == 2
    assert "no Kubernetes credentials" in done.stderr
    assert "Traceback" not in done.stderr


def test_operator_cli_help_lists_the_options() -> None:
    done = subprocess.run([str(KUBEMOOT), "operator", "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0
    for option in ("--namespace", "--all-namespaces", "--nats", "--embedded",
                   "--probe-interval"):
        assert option in done.stdout


def test_operator_cli_serves_metrics_before_it_needs_a_cluster(tmp_path: Path) -> None:
    """``--metrics-port`` binds before the login; a taken port is bad input (exit 2)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "missing"))
        done = run("--embedded", "--metrics-port", str(port), env=env)
    assert done.returncode == 2, done.stderr
    assert "--metrics-port" in done.stderr and "Traceback" not in done.stderr


def test_operator_start_up_line_masks_the_password_and_sigterm_stops_it(
    tmp_path: Path,
) -> None:
    """SIGTERM while the operator still connects: one line, exit 143, no password shown."""
    import signal

    from kubemoot.testing.nats_server import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEMOOT_NATS")}
    env.update(HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "config"))
    (tmp_path / "config").write_text(KUBECONFIG)
    url = f"nats://kube:hunter2@127.0.0.1:{free_port()}"  # nothing listens there
    with subprocess.Popen([str(KUBEMOOT), "operator", "--nats", url], text=True, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("connecting to NATS"):
                break
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    text = "".join(seen) + err
    assert proc.returncode == 128 + signal.SIGTERM, text
    assert "shared state in nats://kube:***@127.0.0.1:" in text
    assert "hunter2" not in text and "Traceback" not in text
    assert text.strip().splitlines()[-1] == "terminated"
