"""Bad input gets a clear JSON error with the right status, never a traceback, and the
gateway keeps serving afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kubemoot.api.errors import InputError
from kubemoot.gateway.keys import load_api_keys
from tests.gateway.conftest import Fleet

HELLO = [{"role": "user", "content": "hi"}]
KUBEMOOT = [sys.executable, "-c", "from kubemoot.cli import main; main()"]


async def _still_serves(http: httpx.AsyncClient) -> None:
    ok = await http.post("/api/chat", json={"model": "small:1b", "messages": HELLO,
                                            "stream": False})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/api/chat", b"{not json", 400, "invalid JSON body"),
    ("/api/chat", b"[1, 2]", 400, "must be a JSON object"),
    ("/api/chat", b"", 400, "needs a JSON body"),
    ("/api/chat", b'{"messages": []}', 400, "model is required"),
    ("/api/chat", b'{"model": 7, "messages": []}', 400, "model must be a string"),
    ("/api/chat", b'{"model": "small:1b", "messages": "hi"}', 400, "messages must be a list"),
    ("/api/chat", b'{"model": "small:1b", "messages": [3]}', 400, "messages[0]"),
    ("/api/chat", b'{"model": "small:1b", "messages": [], "stream": "yes"}', 400, "stream"),
    ("/api/chat", b'{"model": "small:1b", "messages": [], "options": 3}', 400, "options"),
    ("/api/chat", b'{"model": "small:1b", "messages": [], "options": {"num_ctx": -1}}',
     400, "options.num_ctx"),
    ("/api/chat", b'{"model": "small:1b", "messages": [], "keep_alive": "soon"}', 400,
     "keep_alive"),
    # the emulator's rules too (one parser): past what Ollama's durations can hold
    ("/api/chat", b'{"model": "small:1b", "messages": [], "keep_alive": 1' + b"0" * 400
     + b"}", 400, "keep_alive is out of range"),
    ("/api/chat", b'{"model": "small:1b", "messages": [], "keep_alive": "nan"}', 400,
     "keep_alive is out of range"),
    ("/api/generate", b'{"model": "small:1b", "prompt": 5}', 400, "prompt must be a string"),
    ("/api/embed", b'{"model": "small:1b", "input": [1]}', 400, "input"),
    ("/api/show", b'{}', 400, "model is required"),
    ("/api/pull", b'{"model": "x"}', 501, "pull is not supported"),
    ("/api/create", b'{"model": "x"}', 501, "create is not supported"),
    ("/api/nothing", b'{}', 404, "no route"),
])
async def test_ollama_routes_answer_bad_input_in_ollama_shape(
        fleet: Fleet, path: str, body: bytes, status: int, words: str) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        answer = await http.post(path, content=body)
        assert answer.status_code == status
        error = answer.json()["error"]
        assert isinstance(error, str) and words in error
        assert "Traceback" not in answer.text
        await _still_serves(http)


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/v1/chat/completions", b"{", 400, "invalid JSON body"),
    ("/v1/chat/completions", b'{"model": "small:1b", "messages": []}', 400, "non-empty"),
    ("/v1/chat/completions", b'{"model": "small:1b", "messages": [{"content": "x"}]}', 400,
     "role"),
    ("/v1/chat/completions",
     b'{"model": "small:1b", "messages": [{"role": "user", "content": "x"}], '
     b'"temperature": "hot"}', 400, "temperature"),
    ("/v1/embeddings", b'{"model": "small:1b", "input": 3}', 400, "input"),
    ("/v1/nothing", b'{}', 404, "no route"),
])
async def test_openai_routes_answer_bad_input_in_openai_shape(
        fleet: Fleet, path: str, body: bytes, status: int, words: str) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        answer = await http.post(path, content=body)
        assert answer.status_code == status
        error = answer.json()["error"]
        assert words in error["message"] and "type" in error
        await _still_serves(http)


async def test_huge_bodies_are_refused_before_parsing(fleet: Fleet) -> None:
    limit = fleet.gateway.settings.max_body_bytes
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        declared = await http.post("/api/chat", content=b"x" * (limit + 1))
        assert declared.status_code == 413 and "larger than" in declared.json()["error"]

        async def chunks():  # no Content-Length: the limit holds while reading
            for _ in range(limit // 65536 + 2):
                yield b"x" * 65536

        streamed = await http.post("/api/chat", content=chunks())
        assert streamed.status_code == 413
        await _still_serves(http)


async def test_wait_budget_header_must_be_a_number(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        answer = await http.post("/api/chat", json={"model": "small:1b", "messages": HELLO},
                                 headers={"X-Kubemoot-Wait-Budget": "forever"})
        assert answer.status_code == 400 and "X-Kubemoot-Wait-Budget" in answer.json()["error"]


async def test_api_keys_guard_every_route_but_root_and_metrics(keyed: Fleet) -> None:
    async with httpx.AsyncClient(base_url=keyed.url) as http:
        assert (await http.get("/")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        missing = await http.get("/api/tags")
        assert missing.status_code == 401 and "API key" in missing.json()["error"]
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = await http.get("/v1/models", headers={"Authorization": "Bearer sk-nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert "sk-nope" not in wrong.text
        good = {"Authorization": "Bearer sk-alice-secret"}
        assert (await http.get("/api/tags", headers=good)).status_code == 200
        chat = await http.post("/api/chat", headers=good, json={
            "model": "small:1b", "messages": HELLO, "stream": False})
        assert chat.status_code == 200


def test_keys_file_errors_name_the_line_and_never_the_key(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team keys\nalice: sk-a\n\nbob sk-secret-b\n")
    with pytest.raises(InputError) as error:
        load_api_keys(path)
    assert "line 4" in str(error.value) and "sk-secret-b" not in str(error.value)
    path.write_text("alice: sk-a\nbob: sk-a\n")
    with pytest.raises(InputError, match="also another name's key"):
        load_api_keys(path)
    path.write_text("alice: sk-a\nbob: sk-b\n")
    keys = load_api_keys(path)
    assert keys.caller("Bearer sk-b") == "bob" and len(keys) == 2


def test_cli_refuses_a_public_address_without_keys() -> None:
    done = subprocess.run([*KUBEMOOT, "gateway", "--provider", "http://127.0.0.1:1",
                           "--listen", "0.0.0.0:0"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "--api-keys" in done.stderr and "--allow-anonymous" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--listen", "nowhere"], "HOST:PORT"),
    (["--provider", "ftp://x"], "--provider"),
    (["--wait-limit", "soon"], "--wait-limit"),
    ([], "no provider"),
    # the shipped homelab bundle once named the gateway's default port for a card
    (["--provider", "gpu=http://localhost:11435"], "provider gpu has the gateway's own"),
])
def test_cli_bad_flags_exit_2_with_a_message(args: list[str], words: str) -> None:
    done = subprocess.run([*KUBEMOOT, "gateway", *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr


def test_help_names_what_each_flag_takes_as_the_doc_does() -> None:
    """``gateway --help`` used to show ``<list[Path]>``, ``<str>`` and ``<path>`` where a
    reader expects a bundle, a duration and a file, and left ModelClass out of ``-f``."""
    from typer.testing import CliRunner

    from kubemoot.cli import app

    done = CliRunner().invoke(app, ["gateway", "--help"], env={"COLUMNS": "100"})
    assert done.exit_code == 0, done.output
    assert "<" not in done.output.replace("<key>", "")
    for shown in ("-f, --file BUNDLE", "--wait-limit DURATION", "--max-keep-alive DURATION",
                  "--probe-interval DURATION", "--api-keys FILE", "ModelClass", "11435"):
        assert shown in done.output, shown
    doc = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    for flag in ("--provider", "--listen", "--wait-limit", "--max-keep-alive", "--api-keys",
                 "--allow-anonymous", "--nats"):
        assert flag in doc and flag in done.output, flag


def test_a_taken_address_names_the_listen_flag() -> None:
    """The gateway has no --port: a taken address used to be blamed on one."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*KUBEMOOT, "gateway", "--provider", "http://127.0.0.1:1",
                               "--listen", f"127.0.0.1:{port}"], capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "field --listen" in done.stderr and "--port" not in done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_a_provider_that_does_not_answer_is_named_at_start_up() -> None:
    """A dead server used to show only as 'model not found' on the first call."""
    import signal

    from kubemoot.testing.nats_server import free_port

    dead = free_port()  # nothing listens there
    process = subprocess.Popen(
        [*KUBEMOOT, "gateway", "--provider", f"gpu=http://127.0.0.1:{dead},vramMiB=1000",
         "--listen", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:  # up to the banner, which follows the first probe
            seen.append(line)
            if line.startswith("gateway: "):
                break
        said = "".join(seen)
        assert f"provider gpu (http://127.0.0.1:{dead}) did not answer its first probe" \
            in said, said
        assert "Traceback" not in said
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


@pytest.mark.parametrize("text", ["nan", "inf", "-5", "soon", ""])
def test_a_duration_flag_must_be_a_finite_duration(text: str) -> None:
    # --wait-limit nan used to pass (nan < 0 is false) and made every wait endless.
    from kubemoot.api.errors import InputError
    from kubemoot.cli.gateway import parse_duration

    with pytest.raises(InputError) as caught:
        parse_duration(text, "--wait-limit")
    assert caught.value.field == "--wait-limit"


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("30m", 1800.0),
                                               ("1h", 3600.0), ("250ms", 0.25)])
def test_a_duration_flag_reads_like_ollama(text: str, seconds: float) -> None:
    from kubemoot.cli.gateway import parse_duration

    assert parse_duration(text, "--wait-limit") == seconds


@pytest.mark.parametrize(("endpoint", "listen", "itself"), [
    ("http://127.0.0.1:11435", ("127.0.0.1", 11435), True),
    ("http://localhost:11435/", ("127.0.0.1", 11435), True),
    ("http://127.0.0.1:11435", ("0.0.0.0", 11435), True),
    ("http://gw.lan:8080", ("gw.lan", 8080), True),
    ("http://127.0.0.1:11434", ("127.0.0.1", 11435), False),
    ("http://rig-b:11435", ("127.0.0.1", 11435), False),
    ("http://127.0.0.1", ("127.0.0.1", 11435), False),
])
def test_a_provider_at_the_gateways_own_address_is_found(
        endpoint: str, listen: tuple[str, int], itself: bool) -> None:
    """A gateway that took itself for a provider called itself on every probe and took
    its own fleet's copies for that provider's."""
    from kubemoot.cli.gateway import points_at_itself

    assert points_at_itself(endpoint, *listen) is itself
