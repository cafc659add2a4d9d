"""docs/homelab.md, run as written: every command of the guide, against emulators.

The commands are read out of the markdown, so the guide and this test cannot drift:

* a ```` ```bash ```` block is a script: it runs in ``bash -e`` in a scratch directory,
  with the servers ``http://rig-a:11434`` and ``http://rig-b:11434`` pointed at two
  Ollama-API emulators, and must exit 0;
* a bash block that is one ``kubemoot gateway`` command starts the gateway in the
  background on a free port (the guide's ``127.0.0.1:11435`` in every later block is
  rewritten to it); it must be up before the next block runs, and at the end it is
  stopped with SIGTERM and must exit 143, as a service manager would stop it;
* an ``export`` line holds for the blocks after it, as in the reader's terminal;
* the ```` ```sh ```` block (a NATS server and the dashboard, each left running) and the
  ``--nats`` flag the prose adds to the gateway are run by a test of their own, with a
  real nats-server;
* a ```` ```yaml ```` block that starts with ``# file: NAME`` is saved as NAME first;
* a ```` ```text ```` block right after a script is output: each of its lines must be
  a line of what that script printed.

The emulators are the fleet the guide's opening describes, read from its words (each
card's GiB, ``OLLAMA_NUM_PARALLEL``, ``OLLAMA_CONTEXT_LENGTH``, the models pulled);
what the cards hold when the commands start is only what the guide's own first block
loads.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from kubemoot.emulation.server import DEFAULT_MODELS, OllamaEmulator
from kubemoot.runtime.what_if import load_state
from kubemoot.testing.emulators import emulator_factory
from kubemoot.testing.nats_server import NatsServer, free_port

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "homelab.md"
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SERVERS = ("rig-a", "rig-b")
GATEWAY = "127.0.0.1:11435"  # where the guide's gateway listens (its default)


@dataclass(frozen=True)
class Block:
    kind: str
    text: str


def blocks(markdown: str) -> list[Block]:
    return [Block(m.group(1), m.group(2)) for m in FENCE.finditer(markdown)]


def commands(block: Block) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", block.text)
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@dataclass(frozen=True)
class Fleet:
    """The servers the guide's opening describes."""

    vram_gib: dict[str, int]
    num_parallel: int
    context_length: int
    models: tuple[str, ...]


def described_fleet(markdown: str) -> Fleet:
    """The fleet as the guide's words describe it, so the emulators are that fleet."""
    prose = " ".join(markdown.split())
    sizes = {host: re.search(rf"`{host}` \(a (\d+) GiB card\)", prose) for host in SERVERS}
    parallel = re.search(r"`OLLAMA_NUM_PARALLEL=(\d+)`", prose)
    context = re.search(r"`OLLAMA_CONTEXT_LENGTH=(\d+)`", prose)
    pulled = re.search(r"both with (.+?) pulled", prose)
    assert all(sizes.values()) and parallel and context and pulled, (
        "the guide's opening no longer describes its servers")
    return Fleet({h: int(m.group(1)) for h, m in sizes.items() if m},
                 int(parallel.group(1)), int(context.group(1)),
                 tuple(re.findall(r"`([^`]+)`", pulled.group(1))))


@pytest.fixture
def servers() -> Iterator[dict[str, str]]:
    """Two emulators, exactly the fleet the guide describes, holding nothing yet."""
    fleet = described_fleet(GUIDE.read_text())
    catalogue = {m.name: m for m in DEFAULT_MODELS}
    assert set(fleet.models) <= set(catalogue), fleet.models
    # Keep-alives are emulated seconds, the gateway's too: it asks the engine for its
    # engine_keep_alive (1,800 s), 18 real seconds here, so a copy the guide loaded is
    # still listed when a later block runs on a busy machine (at 0.001 it lapsed after
    # 1.8 s, and `/api/ps` missed qwen3:32b whenever the block between took longer).
    with emulator_factory({"num_parallel": fleet.num_parallel,
                           "context_length": fleet.context_length,
                           "models": tuple(catalogue[m] for m in fleet.models),
                           "time_scale": 0.01, "keep_alive_s": 30_000.0}) as make:
        made: dict[str, OllamaEmulator] = {host: make(vram_mib=gib * 1024)
                                           for host, gib in fleet.vram_gib.items()}
        yield {host: emulator.url for host, emulator in made.items()}


def test_the_fleet_the_guide_describes() -> None:
    assert described_fleet(GUIDE.read_text()) == Fleet(
        {"rig-a": 32, "rig-b": 24}, 2, 8192, ("qwen3:8b", "qwen3:14b", "qwen3:32b"))


def first_script(found: list[Block]) -> Block:
    """The guide's opening block: what it loads before step 1."""
    return next(b for b in found if b.kind == "bash")


def environment() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "80", "NO_COLOR": "1"}
    env.pop("KUBEMOOT_DEBUG", None)
    env.pop("OLLAMA_HOST", None)
    return env


def with_servers(script: str, servers: dict[str, str]) -> str:
    for host, url in servers.items():
        script = script.replace(f"http://{host}:11434", url)
    return script


def run(script: str, *, cwd: Path, servers: dict[str, str]) -> str:
    script = with_servers(script, servers)
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd,
                          env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    return done.stdout


def start(command: str, *, cwd: Path, servers: dict[str, str],
          says: str) -> subprocess.Popen[str]:
    """A long-running command of the guide; returns once its start-up line ``says``."""
    process = subprocess.Popen(
        ["bash", "-c", f"exec {with_servers(command, servers)}"],
        cwd=cwd, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    assert process.stderr is not None
    said = []
    for line in process.stderr:  # its start-up line is the event we wait on
        said.append(line)
        if line.startswith(says):
            return process
    process.wait()
    raise AssertionError(f"{command} did not start:\n{''.join(said)}")


def start_gateway(command: str, *, cwd: Path, servers: dict[str, str],
                  listen: str) -> subprocess.Popen[str]:
    """The guide's gateway command, on ``listen`` instead of its default address."""
    assert "--listen" not in command, "the guide's gateway uses its default address"
    return start(f"{command} --listen {listen}", cwd=cwd, servers=servers,
                 says=f"gateway: http://{listen}")


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM, as systemd or Kubernetes would stop it: a clean exit, 128 + 15."""
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=60)
    assert process.returncode == 143, rest
    assert "Traceback" not in rest


def kill(process: subprocess.Popen[str] | None) -> None:
    if process is not None and process.poll() is None:
        process.kill()
        process.wait()


def is_gateway(block: Block) -> bool:
    return block.kind == "bash" and commands(block)[0].startswith("kubemoot gateway ")


def test_the_guide_has_what_the_test_runs() -> None:
    found = blocks(GUIDE.read_text())
    ran = [c for b in found if b.kind == "bash" for c in commands(b)]
    assert len(ran) >= 5 and sum(c.startswith("kubemoot ") for c in ran) >= 5, ran
    # The gateway section: one gateway command alone in its block, requests after it.
    gateways = [i for i, b in enumerate(found) if is_gateway(b)]
    assert len(gateways) == 1 and len(commands(found[gateways[0]])) == 1
    after = "\n".join(b.text for b in found[gateways[0] + 1:] if b.kind == "bash")
    assert "OLLAMA_HOST" in after and f"{GATEWAY}/v1" in after and "/api/ps" in after
    assert any(b.kind == "yaml" and b.text.startswith("# file: ") for b in found)
    assert any(b.kind == "text" for b in found)
    text = GUIDE.read_text()
    assert all(f"http://{host}:11434" in text for host in SERVERS)


@pytest.mark.timeout(600)
def test_every_command_of_the_homelab_guide_runs(
    servers: dict[str, str], tmp_path: Path
) -> None:
    missing = [tool for tool in ("curl", "jq") if shutil.which(tool) is None]
    assert not missing, f"the guide's gateway section uses {missing}"
    listen = f"127.0.0.1:{free_port()}"
    gateway: subprocess.Popen[str] | None = None
    exports: list[str] = []  # the reader's shell: what earlier blocks exported
    last = ""
    try:
        for block in blocks(GUIDE.read_text()):
            if block.kind == "yaml" and block.text.startswith("# file: "):
                name = block.text.splitlines()[0].removeprefix("# file: ").strip()
                yaml.safe_load(block.text)  # the guide's YAML must at least parse
                (tmp_path / name).write_text(block.text)
            elif is_gateway(block):
                gateway = start_gateway(commands(block)[0], cwd=tmp_path, servers=servers,
                                        listen=listen)
            elif block.kind == "bash":
                script = block.text.replace(GATEWAY, listen) if gateway else block.text
                last = run("\n".join([*exports, script]), cwd=tmp_path, servers=servers)
                exports += [line for line in script.splitlines()
                            if line.startswith("export ")]
            elif block.kind == "text":
                printed = {" ".join(line.split()) for line in last.splitlines()}
                for line in block.text.splitlines():
                    if line.strip():
                        assert " ".join(line.split()) in printed, (line, last)
        assert gateway is not None, "the guide never started its gateway"
        stop(gateway)
    finally:
        kill(gateway)

    # The snapshot step 2 wrote holds both cards with the sizes the guide gave them.
    state = load_state(tmp_path / "fleet.yaml")
    cards = {p.name: p for p in state.providers}
    assert {n: c.total_vram_mib for n, c in cards.items()} == {"big": 32768, "small": 24576}
    assert [r.model for r in cards["small"].residents] == ["qwen3:14b"]
    assert all(c.max_parallel == 2 and c.context_length == 8192 for c in cards.values())
    assert {m.name for m in state.models} == {"qwen3:8b", "qwen3:14b", "qwen3:32b"}


def test_the_guide_sizes_models_as_a_probe_of_its_servers_shows_them(
    servers: dict[str, str], tmp_path: Path
) -> None:
    """Step 3 says to take sizes from a probe after loading each model once: the
    scenario's sizes are what that gives on the guide's cards."""
    found = blocks(GUIDE.read_text())
    scenario = next(yaml.safe_load(b.text) for b in found
                    if b.kind == "yaml" and b.text.startswith("# file: "))
    run(first_script(found).text, cwd=tmp_path, servers=servers)  # qwen3:14b on rig-b
    for model in ("qwen3:8b", "qwen3:32b"):
        httpx.post(f"{servers['rig-a']}/api/generate", json={"model": model}, timeout=30)
    shown = run("kubemoot probe a=http://rig-a:11434 b=http://rig-b:11434 "
                "--num-parallel 2 --context-length 8192 -o state",
                cwd=tmp_path, servers=servers)
    probed = {m["name"]: m.get("vramMiB") for m in yaml.safe_load(shown)["models"]}
    assert {m["name"]: m["vramMiB"] for m in scenario["spec"]["models"]} == probed


@pytest.mark.nats
@pytest.mark.timeout(300)
def test_the_dashboard_of_the_guide_shows_where_the_gateway_calls_ran(
    servers: dict[str, str], tmp_path: Path
) -> None:
    """Step 4's dashboard: a NATS server, the guide's gateway with the ``--nats`` flag
    the prose adds, the guide's first request, then the dashboard the ``sh`` block
    starts must show that call on the card the headers named."""
    text = GUIDE.read_text()
    found = blocks(text)
    flag = re.search(r"Add `(--nats (\S+))` to the\s+gateway command", text)
    assert flag is not None, "the guide no longer says how to give the gateway NATS"
    nats_line, dashboard_line = commands(next(b for b in found if b.kind == "sh"))
    assert nats_line == "nats-server -js"  # what NatsServer runs, on a port of its own
    at = next(i for i, b in enumerate(found) if is_gateway(b))
    request = next(b for b in found[at + 1:] if b.kind == "bash")
    listen, board = f"127.0.0.1:{free_port()}", free_port()

    run(first_script(found).text, cwd=tmp_path, servers=servers)  # as the reader did
    nats = NatsServer()
    asyncio.run(nats.start())
    gateway = dashboard = None
    try:
        gateway = start_gateway(f"{commands(found[at])[0]} {flag.group(1)}".replace(
            flag.group(2), nats.url), cwd=tmp_path, servers=servers, listen=listen)
        shown = run(request.text.replace(GATEWAY, listen), cwd=tmp_path, servers=servers)
        assert "x-kubemoot-provider: big" in shown.lower()
        dashboard = start(f"{dashboard_line.replace(flag.group(2), nats.url)} --port {board}",
                          cwd=tmp_path, servers=servers, says="dashboard: http://")
        seen: set[tuple[str, ...]] = set()
        cards: dict[str, set[str]] = {}
        with httpx.stream("GET", f"http://127.0.0.1:{board}/events", timeout=60) as page:
            for line in page.iter_lines():  # one snapshot per change of the store
                if not line.startswith("data: "):
                    continue
                snapshot = json.loads(line.removeprefix("data: "))
                seen = {(a["agent"], c["model"], c["provider"], c["action"])
                        for a in snapshot["agents"] for c in a["recent"]}
                cards = {p["provider"]: {m["name"] for m in p["models"]}
                         for p in snapshot["providers"]}
                if seen and "qwen3:32b" in cards.get("big", set()):
                    break  # the call is logged and a probe since has seen its load
        assert seen == {("anonymous", "qwen3:32b", "big", "cold-load")}
        assert cards == {"big": {"qwen3:32b"}, "small": {"qwen3:14b"}}
        stop(dashboard)
        stop(gateway)
    finally:
        kill(dashboard)
        kill(gateway)
        asyncio.run(nats.close())
