"""``kubemoot probe`` and ``kubemoot emulate-ollama``, run as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kubemoot.emulation.server import EMULATOR_VERSION, OllamaEmulator
from tests.providers.conftest import SMALL

KUBEMOOT = str(Path(sys.executable).with_name("kubemoot"))


def kubemoot(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("KUBEMOOT_DEBUG", None)
    return subprocess.run([KUBEMOOT, *args], capture_output=True, text=True, timeout=60,
                          env=env)


def test_probe_prints_the_state_of_a_live_and_a_dead_provider(
    emulator: OllamaEmulator, closed_port: int,
) -> None:
    with httpx.Client() as http:
        http.post(f"{emulator.url}/api/generate", json={"model": SMALL.name})
    done = kubemoot("probe", f"live={emulator.url}", f"dead=127.0.0.1:{closed_port}",
                    "--context-length", "1024", "--num-parallel", "2", "-o", "json")
    assert done.returncode == 0, done.stderr
    live, dead = json.loads(done.stdout)
    assert live["provider"] == "live" and live["ready"] is True
    assert live["contextLength"] == 1024 and live["maxParallel"] == 2
    assert live["loadedModels"][0]["name"] == SMALL.name
    assert live["loadedModelFootprints"] == {SMALL.name: 1008}
    assert dead["ready"] is False and "refused" in dead["reason"]
    table = kubemoot("probe", f"dead=127.0.0.1:{closed_port}")
    assert table.returncode == 0 and "dead not ready" in table.stdout


@pytest.mark.parametrize("endpoint", ["ftp://host:1", "http://host:notaport", "http://"])
def test_probe_rejects_a_malformed_url(endpoint: str) -> None:
    done = kubemoot("probe", endpoint)
    assert done.returncode == 2
    assert "malformed endpoint" in done.stderr and "Traceback" not in done.stderr


def test_emulate_help_says_it_is_an_emulator() -> None:
    done = kubemoot("emulate-ollama", "--help")
    assert done.returncode == 0
    assert "EMULATOR" in done.stdout and "not Ollama" in done.stdout


@pytest.mark.parametrize("model", ["nosize", "m=lots", "m=-4"])
def test_emulate_rejects_a_bad_model_option(model: str) -> None:
    done = kubemoot("emulate-ollama", "--port", "0", "--model", model)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_emulate_refuses_a_taken_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        done = kubemoot("emulate-ollama", "--port", str(taken.getsockname()[1]))
    assert done.returncode == 2 and "cannot listen" in done.stderr


def test_emulate_serves_in_the_foreground() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [KUBEMOOT, "emulate-ollama", "--port", str(port), "--vram-mib", "4096",
         "--num-parallel", "3", "--time-scale", "0", "--model", "tiny:1b=512"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        assert process.stderr is not None
        announced = ""  # it announces itself once it serves (wrapped over a few lines)
        while "stops it" not in announced:
            line = process.stderr.readline()
            assert line, (announced, process.communicate(timeout=20))
            announced += line
        announced = " ".join(announced.split())
        assert f"on {url}" in announced, announced
        version = httpx.get(f"{url}/api/version").json()["version"]
        assert version == EMULATOR_VERSION
        tags = httpx.get(f"{url}/api/tags").json()["models"]
        assert [(m["name"], m["size"]) for m in tags] == [("tiny:1b", 512 * 1024 * 1024)]
        done = kubemoot("probe", url, "--num-parallel", "3", "-o", "yaml")
        assert done.returncode == 0 and "ready: true" in done.stdout
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=20)
    assert "not Ollama" in announced and "1024 MiB reserved" in announced
    assert "Traceback" not in stderr
