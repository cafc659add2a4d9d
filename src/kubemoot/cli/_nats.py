"""NATS connection options, shared by every command that talks to NATS.

A command declares all of them with :func:`nats_options`, which puts the options in
the place of one ``nats: NatsFlags`` parameter and hands the command what was given as
a :class:`NatsFlags`; :func:`resolve_nats` turns that into
:class:`~kubemoot.settings.NatsSettings`::

    @app.command("watch")
    @nats_options()
    def watch(nats: NatsFlags = NO_NATS_FLAGS, other: int = typer.Option(…)) -> None:
        settings = resolve_nats(nats, use_nats=nats.url is not None)

Precedence: a flag wins over its ``KUBEMOOT_NATS_*`` variable, which wins over the
default. Authentication is one of three ways (user and password, token, credentials
file); when flags pick one, variables naming another are ignored, so a flag is never
overruled by something left in the environment. Every mistake the client could only
report as a failed connection (a bad scheme, a missing file, half a user/password pair,
two ways to authenticate) is an :class:`InputError` naming the flag or variable, before
any connection is tried.

``kubemoot.store.nats`` is imported only inside the functions, so ``--help`` stays fast.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast
from urllib.parse import urlsplit

import typer

from kubemoot.api.errors import InputError
from kubemoot.settings import ENV_VARIABLES, ProcessSettings
from kubemoot.store.masking import mask_servers, mask_url

if TYPE_CHECKING:
    from kubemoot.clock import Clock
    from kubemoot.settings import NatsSettings
    from kubemoot.store.protocol import KV

__all__ = [
    "NO_NATS_FLAGS",
    "NatsCA",
    "NatsCert",
    "NatsCreds",
    "NatsFlags",
    "NatsKey",
    "NatsPassword",
    "NatsReconnectAttempts",
    "NatsReconnectWait",
    "NatsToken",
    "NatsUrl",
    "NatsUrlOrEnv",
    "NatsUser",
    "mask_servers",
    "mask_url",
    "merge_nats",
    "nats_options",
    "open_shared_store",
    "resolve_nats",
]

PANEL = "NATS connection"
_CONNECT_WAIT = ProcessSettings().connect_wait_seconds
_CONNECT_WAIT_ENV = ENV_VARIABLES["process.connect_wait_seconds"]
URL_ENV = "KUBEMOOT_NATS_URL"
NATS_SCHEMES = ("nats", "tls")

_URL_HELP = ("NATS JetStream server(s) for the shared state, nats://HOST:PORT or "
             "tls://HOST:PORT, comma-separated")
NatsUrl = Annotated[str | None, typer.Option(
    "--nats", metavar="URL[,URL…]", rich_help_panel=PANEL,
    help=f"{_URL_HELP}; without it the store is the embedded one.",
)]
# For commands that always need NATS unless told otherwise (the operator).
NatsUrlOrEnv = Annotated[str | None, typer.Option(
    "--nats", metavar="URL[,URL…]", rich_help_panel=PANEL,
    help=f"{_URL_HELP} (env KUBEMOOT_NATS_URL).",
)]
NatsUser = Annotated[str | None, typer.Option(
    "--nats-user", metavar="USER", rich_help_panel=PANEL,
    help="User name; needs a password (env KUBEMOOT_NATS_USER).",
)]
NatsPassword = Annotated[str | None, typer.Option(
    "--nats-password", metavar="PASSWORD", rich_help_panel=PANEL,
    help="Password of --nats-user; better set KUBEMOOT_NATS_PASSWORD, since other "
    "users can read a flag in the process list.",
)]
NatsToken = Annotated[str | None, typer.Option(
    "--nats-token", metavar="TOKEN", rich_help_panel=PANEL,
    help="Token authentication (env KUBEMOOT_NATS_TOKEN).",
)]
NatsCreds = Annotated[str | None, typer.Option(
    "--nats-creds", metavar="FILE", rich_help_panel=PANEL,
    help="Credentials file with a user JWT and nkey seed (env KUBEMOOT_NATS_CREDS).",
)]
NatsCA = Annotated[str | None, typer.Option(
    "--nats-tls-ca", metavar="FILE", rich_help_panel=PANEL,
    help="CA certificate(s) to trust for the server (PEM) (env KUBEMOOT_NATS_TLS_CA).",
)]
NatsCert = Annotated[str | None, typer.Option(
    "--nats-tls-cert", metavar="FILE", rich_help_panel=PANEL,
    help="Client certificate for mutual TLS (PEM) (env KUBEMOOT_NATS_TLS_CERT).",
)]
NatsKey = Annotated[str | None, typer.Option(
    "--nats-tls-key", metavar="FILE", rich_help_panel=PANEL,
    help="Private key of --nats-tls-cert (PEM) (env KUBEMOOT_NATS_TLS_KEY).",
)]
NatsReconnectAttempts = Annotated[int | None, typer.Option(
    "--nats-reconnect-attempts", metavar="N", min=-1, rich_help_panel=PANEL,
    help=f"Rounds over the server list before giving up on a lost connection (default "
    f"120, about a minute; -1 or 0: never give up). The first connection also ends after "
    f"{_CONNECT_WAIT:g} s ({_CONNECT_WAIT_ENV}).",
)]
NatsReconnectWait = Annotated[float | None, typer.Option(
    "--nats-reconnect-wait", metavar="SECONDS", min=0.0, rich_help_panel=PANEL,
    help="Seconds between two rounds (default 0.5; the client adds jitter).",
)]


@dataclass(frozen=True, slots=True)
class NatsFlags:
    """The NATS options exactly as given on the command line (``None``: not given)."""

    url: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    reconnect_attempts: int | None = None
    reconnect_wait: float | None = None

    def connection_flags(self) -> list[str]:
        """The flags given besides ``--nats``, by name, in the order of ``--help``."""
        return [flag for attr, flag in _CONNECTION_FLAGS if getattr(self, attr) is not None]

    def names_servers(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether ``--nats`` or, failing that, ``KUBEMOOT_NATS_URL`` names a server."""
        env = os.environ if environ is None else environ
        return bool((self.url or env.get(URL_ENV, "")).strip())


#: What a command's ``nats`` parameter defaults to; :func:`nats_options` replaces it.
NO_NATS_FLAGS = NatsFlags()

_Command = TypeVar("_Command", bound=Callable[..., Any])

# (parameter, NatsFlags attribute, option) of everything but the URL, in --help's order
_PARAMETERS: tuple[tuple[str, str, Any], ...] = (
    ("nats_user", "user", NatsUser),
    ("nats_password", "password", NatsPassword),
    ("nats_token", "token", NatsToken),
    ("nats_creds", "creds", NatsCreds),
    ("nats_tls_ca", "tls_ca", NatsCA),
    ("nats_tls_cert", "tls_cert", NatsCert),
    ("nats_tls_key", "tls_key", NatsKey),
)
_RECONNECT_PARAMETERS: tuple[tuple[str, str, Any], ...] = (
    ("nats_reconnect_attempts", "reconnect_attempts", NatsReconnectAttempts),
    ("nats_reconnect_wait", "reconnect_wait", NatsReconnectWait),
)
# (NatsFlags attribute, flag): a parameter's flag is its name with dashes
_CONNECTION_FLAGS = tuple((attr, "--" + name.replace("_", "-"))
                          for name, attr, _ in (*_PARAMETERS, *_RECONNECT_PARAMETERS))


def nats_options(*, url_from_env: bool = False,
                 reconnect: bool = True) -> Callable[[_Command], _Command]:
    """Give a command the ``--nats*`` options in place of its ``nats: NatsFlags`` parameter.

    ``url_from_env``: the command always uses NATS, ``KUBEMOOT_NATS_URL`` naming the
    servers when ``--nats`` does not (its help says so); otherwise ``--nats`` alone
    chooses NATS over the embedded store. ``reconnect``: also ``--nats-reconnect-*``
    (for commands that keep a connection for long). The command is called with a
    :class:`NatsFlags` of what was given; typer sees the options, one parameter each.
    """
    declared = (("nats", "url", NatsUrlOrEnv if url_from_env else NatsUrl), *_PARAMETERS,
                *(_RECONNECT_PARAMETERS if reconnect else ()))

    def decorate(command: _Command) -> _Command:
        signature = inspect.signature(command, eval_str=True)
        if "nats" not in signature.parameters:
            raise TypeError(f"{command.__name__} has no parameter nats: NatsFlags to replace")
        parameters: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            if parameter.name != "nats":
                parameters.append(parameter)
                continue
            parameters.extend(
                inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  default=None, annotation=option)
                for name, _attr, option in declared)

        @functools.wraps(command)
        def with_flags(**given: Any) -> Any:
            flags = NatsFlags(**{attr: given.pop(name) for name, attr, _ in declared})
            return command(**given, nats=flags)

        # typer reads the options from the signature, and their types from these
        with_flags.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=parameters)
        with_flags.__annotations__ = {p.name: p.annotation for p in parameters}
        return cast(_Command, with_flags)

    return decorate


# (NatsSettings field, NatsFlags attribute, flag, variable) for the string options
_OPTIONS = (
    ("user", "user", "--nats-user", "KUBEMOOT_NATS_USER"),
    ("password", "password", "--nats-password", "KUBEMOOT_NATS_PASSWORD"),
    ("token", "token", "--nats-token", "KUBEMOOT_NATS_TOKEN"),
    ("credentials_file", "creds", "--nats-creds", "KUBEMOOT_NATS_CREDS"),
    ("tls_ca", "tls_ca", "--nats-tls-ca", "KUBEMOOT_NATS_TLS_CA"),
    ("tls_cert", "tls_cert", "--nats-tls-cert", "KUBEMOOT_NATS_TLS_CERT"),
    ("tls_key", "tls_key", "--nats-tls-key", "KUBEMOOT_NATS_TLS_KEY"),
)
_AUTH_WAYS = {"user": ("user", "password"), "token": ("token",), "creds": ("credentials_file",)}


def resolve_nats(
    flags: NatsFlags, *, use_nats: bool, environ: Mapping[str, str] | None = None
) -> NatsSettings | None:
    """The settings to connect with, or ``None`` when the command does not use NATS.

    With ``use_nats`` false, a connection flag is an error rather than silently
    ignored: the user believes it does something.
    """
    if not use_nats:
        given = flags.connection_flags()
        if given:
            raise InputError("applies only to a NATS store; add --nats URL", field=given[0])
        return None
    return merge_nats(flags, environ=environ)


def merge_nats(flags: NatsFlags, *, environ: Mapping[str, str] | None = None) -> NatsSettings:
    """Flags over ``KUBEMOOT_NATS_*`` over defaults, validated (:class:`InputError`)."""
    from kubemoot.settings import NatsSettings

    env = dict(os.environ if environ is None else environ)
    base = NatsSettings.from_env(env)
    values: dict[str, str | None] = {}
    source: dict[str, str] = {}  # settings field → the flag or variable it came from
    from_flag: set[str] = set()
    for name, attr, flag, variable in _OPTIONS:
        given: str | None = getattr(flags, attr)
        if given is not None:
            if not given.strip():
                raise InputError("must not be empty", field=flag)
            values[name], source[name] = given.strip(), flag
            from_flag.add(name)
        else:
            values[name] = getattr(base, name)
            if values[name] is not None:
                source[name] = variable
    _pick_auth(values, source, from_flag)
    _check_auth(values, source)
    for name in ("credentials_file", "tls_ca", "tls_cert", "tls_key"):
        _check_file(values[name], source.get(name, ""))
    if values["credentials_file"] is not None:
        _check_creds(values["credentials_file"], source["credentials_file"])
    servers, url_source = base.servers, URL_ENV
    if flags.url is not None:
        servers = [u.strip() for u in flags.url.split(",") if u.strip()]
        url_source = "--nats"
        if not servers:
            raise InputError("give at least one URL, nats://HOST:PORT", field="--nats")
    for server in servers:
        _check_url(server, url_source)
    settings = dataclasses.replace(
        base, servers=servers, user=values["user"], password=values["password"],
        token=values["token"], credentials_file=values["credentials_file"],
        tls_ca=values["tls_ca"], tls_cert=values["tls_cert"], tls_key=values["tls_key"],
    )
    if flags.reconnect_attempts is not None:
        settings = dataclasses.replace(settings, max_reconnect_attempts=flags.reconnect_attempts)
    if flags.reconnect_wait is not None:
        settings = dataclasses.replace(settings, reconnect_wait=flags.reconnect_wait)
    _check_tls(settings, source)
    return settings


async def open_shared_store(
    settings: NatsSettings | None,
    *,
    clock: Clock | None = None,
    connect_wait: float,
    say: Callable[[str], None] | None = None,
) -> KV:
    """The store a command asked for: NATS with ``settings``, else the embedded one.

    Every command connects through here, so they all behave alike: one line says where
    (passwords masked), a line every few seconds shows the connection is still being
    tried, and the attempt ends after ``connect_wait`` seconds (the process's
    ``connect_wait_seconds``) or the client's own reconnect rounds,
    whichever comes first. Progress goes to ``say`` (default: stderr).

    A NATS client cannot tell a wrong password from a server that is down (both end
    in "no servers available"), so a failed connection says what to check.
    """
    from kubemoot.store import open_store
    from kubemoot.store.protocol import StoreUnavailable

    if settings is None:
        return await open_store(clock=clock)
    tell = say if say is not None else _say
    where = mask_servers(settings.servers)
    tell(f"connecting to NATS at {where} (gives up after {connect_wait:g} s) …")
    loop = asyncio.get_running_loop()
    started = loop.time()
    attempt = asyncio.ensure_future(open_store(clock=clock, nats=settings))
    try:
        while not attempt.done():
            waited = loop.time() - started
            if waited >= connect_wait:
                break
            await asyncio.wait({attempt}, timeout=min(PROGRESS_SECONDS, connect_wait - waited))
            waited = loop.time() - started
            if not attempt.done() and waited < connect_wait:
                tell(f"still connecting to NATS at {where} … {waited:.0f} s of "
                     f"{connect_wait:g} s")
    finally:
        if not attempt.done():
            attempt.cancel()
            # Not an unbounded await: nats-py can drop a cancellation that lands as a
            # connect attempt fails (Python 3.11's wait_for), and keeps trying.
            await asyncio.wait({attempt}, timeout=CANCEL_WAIT_SECONDS)
    if not attempt.done() or attempt.cancelled():
        attempt.add_done_callback(_forget)
        raise StoreUnavailable(f"cannot connect to NATS at {where}: gave up after "
                               f"{connect_wait:g} s{_CHECK}")
    try:
        kv = attempt.result()
    except StoreUnavailable as error:
        # the store wrote its servers masked (kubemoot.store.masking)
        raise StoreUnavailable(str(error) + _CHECK) from None
    tell(f"connected to NATS at {where}")
    return kv


# How often a connection still being tried says so.
PROGRESS_SECONDS = 5.0
# How long an abandoned connection attempt gets to end before it is left behind.
CANCEL_WAIT_SECONDS = 1.0


def _forget(attempt: asyncio.Future[KV]) -> None:
    """An abandoned attempt's outcome is moot; reading it keeps asyncio quiet."""
    if not attempt.cancelled():
        attempt.exception()
_CHECK = " (check that the server is up with JetStream and that the credentials are right)"


def _say(line: str) -> None:
    from kubemoot.cli._common import err_console

    err_console.print(line, highlight=False, soft_wrap=True, markup=False)


# -- checks ----------------------------------------------------------------------------


def _pick_auth(values: dict[str, str | None], source: dict[str, str], from_flag: set[str]) -> None:
    """When flags choose a way to authenticate, drop the other ways the environment set."""
    chosen = {way for way, names in _AUTH_WAYS.items() if from_flag.intersection(names)}
    if not chosen:
        return
    for way, names in _AUTH_WAYS.items():
        if way not in chosen:
            for name in names:
                values[name] = None
                source.pop(name, None)


def _check_auth(values: dict[str, str | None], source: dict[str, str]) -> None:
    ways = [way for way, names in _AUTH_WAYS.items() if any(values[n] for n in names)]
    if len(ways) > 1:
        named = [next(source[n] for n in _AUTH_WAYS[way] if values[n]) for way in ways]
        raise InputError(f"{' and '.join(named)} are two ways to authenticate; give one "
                         "(user and password, a token, or a credentials file)",
                         field=named[-1])
    if values["user"] and not values["password"]:
        raise InputError("a user needs a password (--nats-password or KUBEMOOT_NATS_PASSWORD)",
                         field=source["user"])
    if values["password"] and not values["user"]:
        raise InputError("a password needs a user (--nats-user or KUBEMOOT_NATS_USER)",
                         field=source["password"])


def _check_file(value: str | None, where: str) -> None:
    if value is None:
        return
    path = Path(value)
    if not path.is_file():
        raise InputError(f"no such file: {value}", field=where)
    if not os.access(path, os.R_OK):
        raise InputError(f"cannot read {value}", field=where)


def _check_creds(value: str, where: str) -> None:
    text = Path(value).read_text(errors="replace")
    # nats-py would fail only at connect time, with an error far from the cause.
    if "BEGIN NATS USER JWT" not in text or "BEGIN USER NKEY SEED" not in text:
        raise InputError(f"{value} is not a NATS credentials file (a user JWT and an nkey "
                         "seed, as `nsc generate creds` writes)", field=where)


def _check_url(url: str, where: str) -> None:
    shown = mask_url(url)  # an error message is no place for a password
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a port that is not a number in range
    except ValueError as error:
        raise InputError(f"{shown!r} is not a valid URL: {error}", field=where) from None
    if parts.scheme not in NATS_SCHEMES:
        raise InputError(f"{shown!r} is not a NATS URL (unknown store URL scheme "
                         f"{parts.scheme or 'none'!r}); use nats://HOST:PORT or "
                         "tls://HOST:PORT", field=where)
    if not parts.hostname:
        raise InputError(f"{shown!r} names no host; use nats://HOST:PORT", field=where)
    if parts.path not in ("", "/") or parts.query or parts.fragment or port == 0:
        raise InputError(f"{shown!r} is not a server address; use nats://HOST:PORT",
                         field=where)


def _check_tls(settings: NatsSettings, source: dict[str, str]) -> None:
    """Load the TLS files now: a bad one is the user's mistake, not a network failure."""
    if settings.tls_key and not settings.tls_cert:
        raise InputError("a TLS key needs its certificate (--nats-tls-cert)",
                         field=source["tls_key"])
    if settings.tls_ca:
        try:
            ssl.create_default_context(cafile=settings.tls_ca)
        except (ssl.SSLError, OSError, ValueError) as error:
            raise InputError(f"cannot use {settings.tls_ca} as a CA: {error}",
                             field=source["tls_ca"]) from None
    if settings.tls_cert:
        try:
            settings.tls_context()
        except (ssl.SSLError, OSError, ValueError) as error:
            raise InputError(f"cannot load the client certificate and key: {error}",
                             field=source["tls_cert"]) from None
