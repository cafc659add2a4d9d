"""The ``--nats*`` connection options: merged over ``KUBEMOOT_NATS_*``, validated, used.

The merge and validation tables run in-process; one real ``nats-server`` with a user and
password shows the flags reaching the server from a ``kubemoot`` subprocess.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from kubemoot.api.errors import InputError
from kubemoot.cli import main
from kubemoot.cli._nats import NatsFlags, merge_nats, resolve_nats
from kubemoot.settings import NatsSettings
from kubemoot.store import open_store
from kubemoot.store.nats import NatsKV
from kubemoot.testing.nats_server import NatsServer, free_port
from tests.ci import cannot_run
from tests.operator.test_operator_cli import KUBECONFIG

KUBEMOOT = Path(sys.executable).with_name("kubemoot")
CREDS = """-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QifQ.e30.sig
------END NATS USER JWT------
-----BEGIN USER NKEY SEED-----
SUAEXAMPLESEED
------END USER NKEY SEED------
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """A credentials file, a file that is no certificate, and a path to nothing."""
    (tmp_path / "user.creds").write_text(CREDS)
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    return {
        "creds": str(tmp_path / "user.creds"),
        "junk": str(tmp_path / "junk.pem"),
        "missing": str(tmp_path / "missing.pem"),
    }


def fill(values: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """Replace ``@name`` by the path of that test file."""
    return {k: files[v[1:]] if isinstance(v, str) and v.startswith("@") else v
            for k, v in values.items()}


# -- merging ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "env", "want"),
    [
        pytest.param({}, {}, {"servers": ["nats://127.0.0.1:4222"], "user": None},
                     id="defaults"),
        pytest.param({}, {"KUBEMOOT_NATS_URL": "nats://a:1, tls://b:2"},
                     {"servers": ["nats://a:1", "tls://b:2"]}, id="env-urls"),
        pytest.param({"url": "nats://c:3,nats://d:4"}, {"KUBEMOOT_NATS_URL": "nats://a:1"},
                     {"servers": ["nats://c:3", "nats://d:4"]}, id="flag-urls-win"),
        pytest.param({"user": "bob"},
                     {"KUBEMOOT_NATS_USER": "amy", "KUBEMOOT_NATS_PASSWORD": "pw"},
                     {"user": "bob", "password": "pw"}, id="flag-user-env-password"),
        pytest.param({"token": "t0k"},
                     {"KUBEMOOT_NATS_USER": "amy", "KUBEMOOT_NATS_PASSWORD": "pw"},
                     {"token": "t0k", "user": None, "password": None},
                     id="flag-token-drops-env-user"),
        pytest.param({"user": "bob", "password": "pw"}, {"KUBEMOOT_NATS_TOKEN": "t0k"},
                     {"user": "bob", "token": None}, id="flag-user-drops-env-token"),
        pytest.param({"creds": "@creds"}, {"KUBEMOOT_NATS_TOKEN": "t0k"},
                     {"credentials_file": "@creds", "token": None}, id="flag-creds"),
        pytest.param({}, {"KUBEMOOT_NATS_CREDS": "@creds"}, {"credentials_file": "@creds"},
                     id="env-creds"),
        pytest.param({"reconnect_attempts": -1, "reconnect_wait": 2.0}, {},
                     {"max_reconnect_attempts": -1, "reconnect_wait": 2.0}, id="reconnects"),
    ],
)
def test_flags_merge_over_the_environment(flags: dict[str, Any], env: dict[str, str],
                                          want: dict[str, Any],
                                          files: dict[str, str]) -> None:
    got = merge_nats(NatsFlags(**fill(flags, files)), environ=fill(env, files))
    for name, value in fill(want, files).items():
        assert getattr(got, name) == value, name


# -- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "env", "field", "message"),
    [
        pytest.param({"url": "http://a:4222"}, {}, "--nats", "not a NATS URL", id="scheme"),
        pytest.param({}, {"KUBEMOOT_NATS_URL": "redis://a:1"}, "KUBEMOOT_NATS_URL",
                     "not a NATS URL", id="env-scheme"),
        pytest.param({"url": "nats://a:1,nats://"}, {}, "--nats", "names no host",
                     id="no-host"),
        pytest.param({"url": "nats://a:99999"}, {}, "--nats", "not a valid URL", id="port"),
        pytest.param({"url": " , "}, {}, "--nats", "at least one URL", id="empty-list"),
        pytest.param({"user": "bob"}, {}, "--nats-user", "needs a password",
                     id="user-no-password"),
        pytest.param({"password": "pw"}, {}, "--nats-password", "needs a user",
                     id="password-no-user"),
        pytest.param({}, {"KUBEMOOT_NATS_USER": "amy"}, "KUBEMOOT_NATS_USER",
                     "needs a password", id="env-user-no-password"),
        pytest.param({"user": "bob", "password": "pw", "token": "t"}, {}, "--nats-token",
                     "--nats-user and --nats-token are two ways", id="user-and-token"),
        pytest.param({"token": "t", "creds": "@creds"}, {}, "--nats-creds", "two ways",
                     id="token-and-creds"),
        pytest.param({}, {"KUBEMOOT_NATS_TOKEN": "t", "KUBEMOOT_NATS_USER": "u",
                          "KUBEMOOT_NATS_PASSWORD": "p"}, "KUBEMOOT_NATS_TOKEN",
                     "two ways", id="env-user-and-token"),
        pytest.param({"token": "  "}, {}, "--nats-token", "must not be empty", id="blank"),
        pytest.param({"creds": "@missing"}, {}, "--nats-creds", "no such file",
                     id="creds-missing"),
        pytest.param({"creds": "@junk"}, {}, "--nats-creds", "not a NATS credentials file",
                     id="creds-junk"),
        pytest.param({"tls_ca": "@missing"}, {}, "--nats-tls-ca", "no such file",
                     id="ca-missing"),
        pytest.param({"tls_ca": "@junk"}, {}, "--nats-tls-ca", "cannot use", id="ca-junk"),
        pytest.param({}, {"KUBEMOOT_NATS_TLS_CERT": "@junk"}, "KUBEMOOT_NATS_TLS_CERT",
                     "cannot load the client certificate", id="env-cert-junk"),
        pytest.param({"tls_key": "@junk"}, {}, "--nats-tls-key", "needs its certificate",
                     id="key-no-cert"),
    ],
)
def test_bad_options_name_the_flag_or_variable(flags: dict[str, Any], env: dict[str, str],
                                               field: str, message: str,
                                               files: dict[str, str]) -> None:
    with pytest.raises(InputError) as caught:
        merge_nats(NatsFlags(**fill(flags, files)), environ=fill(env, files))
    assert caught.value.field == field
    assert message in caught.value.message


def test_a_real_client_certificate_loads(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        cannot_run("needs the openssl command (.ci/run installs it)")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=kubemoot-test", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    got = merge_nats(NatsFlags(tls_ca=str(cert), tls_cert=str(cert), tls_key=str(key)),
                     environ={})
    assert (got.tls_ca, got.tls_cert, got.tls_key) == (str(cert), str(cert), str(key))
    assert got.tls_context() is not None


def test_without_nats_the_connection_flags_are_refused() -> None:
    assert resolve_nats(NatsFlags(), use_nats=False) is None
    with pytest.raises(InputError) as caught:
        resolve_nats(NatsFlags(token="t", tls_ca="x"), use_nats=False)
    assert caught.value.field == "--nats-token"


# -- through the CLI -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--nats", "http://a:1"], "field --nats: 'http://a:1' is not a NATS URL"),
        (["demo", "--nats-token", "t"], "field --nats-token: applies only to a NATS store"),
        (["dashboard", "--nats", "nats://a:1", "--nats-user", "u"],
         "field --nats-user: a user needs a password"),
        (["dashboard", "--nats", "nats://a:1", "--nats-creds", "/no/such.creds"],
         "field --nats-creds: no such file"),
        (["operator", "--nats", "nats://a:1", "--nats-user", "u", "--nats-password", "p",
          "--nats-token", "t"], "field --nats-token: --nats-user and --nats-token"),
        (["operator", "--embedded", "--nats-tls-ca", "/ca.pem"],
         "field --nats-tls-ca: applies only to a NATS store"),
    ],
)
def test_commands_exit_2_with_one_line(args: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("URL", "USER", "PASSWORD", "TOKEN", "CREDS", "TLS_CA", "TLS_CERT", "TLS_KEY"):
        monkeypatch.delenv(f"KUBEMOOT_NATS_{name}", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(args)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert message in err


async def test_open_store_takes_settings_over_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEMOOT_NATS_URL", "nats://127.0.0.1:1")
    with pytest.raises(ValueError, match="memory"):
        await open_store("memory://", nats=NatsSettings())
    assert type(await open_store()).__name__ == "MemoryKV"


# -- against a real server with a user and password ------------------------------------


@pytest.fixture(scope="module")
def guarded_url() -> Iterator[str]:
    """A ``nats-server -js`` that admits only user ``kube`` with password ``moot``."""
    server = NatsServer(extra_args=("--user", "kube", "--pass", "moot"))
    # A thread of its own: a test using it may already run inside an event loop.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, server.start()).result()
        try:
            yield server.url
        finally:
            thread.submit(asyncio.run, server.close()).result()


def _env(**extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEMOOT_NATS")}
    env.update(extra)
    return env


@pytest.mark.nats
def test_right_credentials_reach_the_server(guarded_url: str) -> None:
    # user from the flag, password from the environment (kept out of the process list)
    command = [str(KUBEMOOT), "dashboard", "--nats", guarded_url, "--nats-user", "kube",
               "--port", "0", "--nats-reconnect-attempts", "2"]
    with subprocess.Popen(command, text=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE,
                          env=_env(KUBEMOOT_NATS_PASSWORD="moot")) as proc:
        try:
            assert proc.stderr is not None
            assert proc.stderr.readline().startswith(f"connecting to NATS at {guarded_url}")
            assert proc.stderr.readline().startswith(f"connected to NATS at {guarded_url}")
            line = proc.stderr.readline()
            assert line.startswith("dashboard: http://127.0.0.1:"), line
            assert guarded_url in line
            url = line.split()[1]
            state = httpx.get(f"{url}/api/state", timeout=10).json()
            assert state["providers"] == []
        finally:
            proc.terminate()
            proc.wait(timeout=20)


@pytest.mark.nats
async def test_the_same_settings_open_the_store_in_process(guarded_url: str) -> None:
    settings = merge_nats(NatsFlags(url=guarded_url, user="kube", password="moot"),
                          environ={})
    kv = await open_store(nats=settings)
    try:
        assert isinstance(kv, NatsKV)
        bucket = await kv.bucket("cli_nats_options")
        await bucket.put("k", b"v")
        entry = await bucket.get("k")
        assert entry is not None and entry.value == b"v"
    finally:
        await kv.close()


@pytest.mark.nats
@pytest.mark.parametrize(
    "auth",
    [
        pytest.param(["--nats-user", "kube", "--nats-password", "wrong"], id="wrong-password"),
        pytest.param(["--nats-token", "kube"], id="token-instead"),
        pytest.param([], id="no-credentials"),
    ],
)
def test_wrong_credentials_fail_with_one_line(guarded_url: str, auth: list[str]) -> None:
    done = subprocess.run(
        [str(KUBEMOOT), "dashboard", "--nats", guarded_url, *auth, "--port", "0"],
        capture_output=True, text=True, timeout=60, env=_env(), check=False)
    assert done.returncode == 1, done.stderr
    # where it connects, then why it failed: two lines, no traceback
    assert done.stderr.count("\n") == 2 and "Traceback" not in done.stderr
    # A refused login is final: reported at once, with the default reconnect settings.
    assert f"NATS at {guarded_url} refused the credentials" in done.stderr
    assert "credentials are right" in done.stderr


# -- where a command connects, and for how long it tries (issue #17.1, #12.11) ----------

CONNECTING = {
    "dashboard": ["dashboard", "--port", "0"],
    "demo": ["demo", "-o", "json"],
    "operator": ["operator"],
}


@pytest.mark.parametrize("command", sorted(CONNECTING))
def test_a_command_says_where_it_connects_shows_progress_and_gives_up(
    command: str, tmp_path: Path
) -> None:
    # Nothing listens there; the password in the URL must never be printed.
    url = f"nats://bob:hunter2@127.0.0.1:{free_port()}"
    (tmp_path / "config").write_text(KUBECONFIG)
    env = _env(KUBEMOOT_CONNECT_WAIT_SECONDS="6", HOME=str(tmp_path),
               KUBECONFIG=str(tmp_path / "config"))
    done = subprocess.run([str(KUBEMOOT), *CONNECTING[command], "--nats", url],
                          capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 1, done.stderr
    shown = url.replace("hunter2", "***")
    lines = done.stderr.splitlines()
    assert f"connecting to NATS at {shown} (gives up after 6 s) …" in lines, done.stderr
    assert any(line.startswith(f"still connecting to NATS at {shown} … ") for line in lines)
    assert f"cannot connect to NATS at {shown}: gave up after 6 s" in done.stderr
    assert "hunter2" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "url",
    ["nats://bob:hunter2@127.0.0.1:4222/path", "http://bob:hunter2@127.0.0.1:4222",
     "nats://bob:hunter2@127.0.0.1:99999",
     # too broken for urlsplit: it used to be shown as given, password and all
     "nats://bob:hunter2@[::1:4222"],
)
def test_a_bad_url_is_named_without_its_password(url: str) -> None:
    with pytest.raises(InputError) as raised:
        merge_nats(NatsFlags(url=url), environ={})
    assert "hunter2" not in str(raised.value) and "bob:***@" in str(raised.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://bob:hunter2@10.0.0.1:4222", "nats://bob:***@10.0.0.1:4222"),
        ("nats://s3cr3t-token@10.0.0.1:4222", "nats://***@10.0.0.1:4222"),
        ("tls://10.0.0.1:4222", "tls://10.0.0.1:4222"),
        ("nats://bob:hunter2@[::1:4222", "nats://bob:***@[::1:4222"),
        ("nats://bob:hun/ter2@10.0.0.1:4222", "nats://bob:***@10.0.0.1:4222"),
        ("nats://bob:hun@ter2@10.0.0.1:4222", "nats://bob:***@10.0.0.1:4222"),
        ("nats://bob:hunter%402@10.0.0.1:4222", "nats://bob:***@10.0.0.1:4222"),
    ],
)
def test_mask_url_hides_passwords_and_tokens(url: str, shown: str) -> None:
    from kubemoot.cli._nats import mask_url

    assert mask_url(url) == shown


def test_every_command_documents_the_same_reconnect_default() -> None:
    """One default and one help text: ``demo --help`` may not promise what it does not do."""
    import typer.main

    from kubemoot.cli import app
    from kubemoot.settings import ProcessSettings

    group: Any = typer.main.get_command(app)
    helps = {
        name: option.help
        for name, command in group.commands.items()
        for option in command.params
        if option.name == "nats_reconnect_attempts"
    }
    assert {"dashboard", "demo"} <= set(helps)
    assert len(set(helps.values())) == 1, helps
    [text] = set(helps.values())
    assert f"default {NatsSettings().max_reconnect_attempts}," in text
    assert f"after {ProcessSettings().connect_wait_seconds:g} s" in text


# -- declared once ---------------------------------------------------------------------


def test_nats_options_hand_the_command_what_was_given() -> None:
    """The options typer sees become one NatsFlags; the command's own options stay put."""
    import typer
    from typer.testing import CliRunner

    from kubemoot.cli._nats import NO_NATS_FLAGS, nats_options

    seen: list[tuple[NatsFlags, int]] = []
    tool = typer.Typer(add_completion=False)

    @tool.command()
    @nats_options(url_from_env=True, reconnect=False)
    def watch(before: int = typer.Option(1, "--before"),
              nats: NatsFlags = NO_NATS_FLAGS,
              after: int = typer.Option(2, "--after")) -> None:
        seen.append((nats, before + after))

    done = CliRunner().invoke(tool, ["--nats", "nats://a:1", "--nats-user", "u",
                                     "--nats-password", "p", "--after", "5"])
    assert done.exit_code == 0, done.output
    assert seen == [(NatsFlags(url="nats://a:1", user="u", password="p"), 6)]
    import typer.main

    options = [p.name for p in typer.main.get_command(tool).params]
    assert options == ["before", "nats", "nats_user", "nats_password", "nats_token",
                       "nats_creds", "nats_tls_ca", "nats_tls_cert", "nats_tls_key", "after"]
    assert "KUBEMOOT_NATS_URL" in CliRunner().invoke(tool, ["--help"]).output


def test_nats_options_need_a_nats_parameter() -> None:
    from kubemoot.cli._nats import nats_options

    def command(other: int = 1) -> None: ...

    with pytest.raises(TypeError, match="no parameter nats"):
        nats_options()(command)


@pytest.mark.parametrize(
    ("url", "environ", "named"),
    [(None, {}, False), (None, {"KUBEMOOT_NATS_URL": "  "}, False),
     (None, {"KUBEMOOT_NATS_URL": "nats://a:1"}, True), ("nats://b:2", {}, True)],
)
def test_servers_are_named_by_the_flag_or_the_variable(
        url: str | None, environ: dict[str, str], named: bool) -> None:
    assert NatsFlags(url=url).names_servers(environ) is named


@pytest.mark.parametrize(
    ("servers", "user", "password"),
    [
        # a URL-encoded password in the URL: the store wrote it as given, unmasked
        pytest.param(["nats://bob:p%40ss@127.0.0.1:{port}"], None, None, id="in-url"),
        # a password that is also a word of the message: it used to be blanked there
        pytest.param(["nats://127.0.0.1:{port}"], "bob", "NATS", id="common-word"),
    ],
)
async def test_the_store_masks_its_servers_where_it_names_them(
        servers: list[str], user: str | None, password: str | None) -> None:
    """Masked where the URL is formatted: the message itself is left as it was written."""
    from kubemoot.cli._nats import open_shared_store
    from kubemoot.store.protocol import StoreUnavailable

    port = free_port()  # nothing listens there
    settings = NatsSettings(servers=[s.format(port=port) for s in servers], user=user,
                            password=password, connect_timeout=1.0,
                            max_reconnect_attempts=1, reconnect_wait=0.0)
    with pytest.raises(StoreUnavailable) as direct:
        await NatsKV.connect(settings)
    with pytest.raises(StoreUnavailable) as through_cli:
        await open_shared_store(settings, connect_wait=30.0, say=lambda line: None)
    shown = (f"nats://bob:***@127.0.0.1:{port}" if password is None
             else f"nats://127.0.0.1:{port}")
    for raised in (direct, through_cli):
        message = str(raised.value)
        assert message.startswith(f"cannot connect to NATS at {shown}: "), message
        assert "p%40ss" not in message and "p@ss" not in message
