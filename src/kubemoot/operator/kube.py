"""A small Kubernetes API client for the objects kopf does not patch for us.

kopf watches and calls the handlers; this client writes: the status subresource of our
custom resources, the env of an Agent's Deployment, and core/v1 Events. It speaks JSON
merge patch only (``application/merge-patch+json``), the one patch type every API server
and every emulator understands for custom resources.

Credentials come from a ``login`` callable returning a :class:`kopf.ConnectionInfo`, the
same one the operator gives kopf, so both use one identity. On HTTP 401 the client logs
in again once: service-account tokens are rotated by the kubelet.

:func:`login_from_environment` is that callable for a real cluster: the in-cluster
service account, else the kubeconfig files of ``$KUBECONFIG`` (or ``~/.kube/config``),
each read and checked here first so that a broken file is named in one line.

Errors: :class:`KubeError` (status, reason, message) for every failed call;
:class:`KubeNotFound` and :class:`KubeConflict` for the two a caller acts on.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import kopf
import yaml

from kubemoot.api import GROUP, VERSION
from kubemoot.api.errors import InputError

__all__ = [
    "KubeClient",
    "KubeConflict",
    "KubeError",
    "KubeNotFound",
    "custom_path",
    "deployment_path",
    "deployments_path",
    "events_path",
    "kubeconfig_paths",
    "login_from_environment",
]

Login = Callable[[], Awaitable[kopf.ConnectionInfo]]
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when nobody answered)."""

    def __init__(self, message: str, *, status: int = 0, reason: str | None = None) -> None:
        self.status = status
        self.reason = reason
        super().__init__(message)


class KubeNotFound(KubeError):
    """HTTP 404: the object does not exist."""


class KubeConflict(KubeError):
    """HTTP 409: the object moved on (resourceVersion) or already exists."""


def custom_path(
    plural: str, name: str, *, namespace: str | None = None, subresource: str | None = None
) -> str:
    """The URL path of one of our custom resources (``kubemoot.ai/v1alpha1``)."""
    scope = f"/namespaces/{namespace}" if namespace else ""
    tail = f"/{subresource}" if subresource else ""
    return f"/apis/{GROUP}/{VERSION}{scope}/{plural}/{name}{tail}"


def deployment_path(namespace: str, name: str) -> str:
    """The URL path of an apps/v1 Deployment."""
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"


def deployments_path(namespace: str) -> str:
    """The URL path of the apps/v1 Deployments of one namespace (list and watch)."""
    return f"/apis/apps/v1/namespaces/{namespace}/deployments"


def events_path(namespace: str) -> str:
    """The URL path of core/v1 Events in a namespace."""
    return f"/api/v1/namespaces/{namespace}/events"


# -------------------------------------------------------------------- credentials


def kubeconfig_paths(environ: Mapping[str, str] | None = None) -> list[str]:
    """The kubeconfig files to read: ``$KUBECONFIG`` (``:``-separated), else the default.

    The same choice kopf's kubeconfig login makes, so the check and the login agree.
    """
    env = os.environ if environ is None else environ
    raw = env.get("KUBECONFIG", "")
    if not raw:
        default = Path("~/.kube/config").expanduser()
        return [str(default)] if default.exists() else []
    return [os.path.expanduser(p.strip()) for p in raw.split(os.pathsep) if p.strip()]


def _one_line(text: object, limit: int = 160) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _credential_error(where: str, problem: str) -> InputError:
    return InputError(f"cannot read Kubernetes credentials from {where}: {problem}")


def _check_kubeconfig(path: str) -> None:
    """Read one kubeconfig and check the shape kopf's parser relies on.

    kopf reads these files with bare indexing, so a typo surfaces as a YAML parser
    dump or a ``KeyError``; checking first lets the message name the file and the entry.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise _credential_error(path, "not UTF-8 text") from None
    except OSError as error:
        raise _credential_error(path, error.strerror or type(error).__name__) from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or error.context or "invalid YAML"
        raise _credential_error(path, f"YAML syntax error{at}: {problem}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as error:
        raise _credential_error(path, f"YAML error: {_one_line(error)}") from None
    if data is None:
        return  # an empty file contributes nothing, as for kubectl
    if not isinstance(data, dict):
        raise _credential_error(path, f"a kubeconfig must be a mapping, got "
                                      f"{type(data).__name__}")
    for section in ("contexts", "clusters", "users"):
        entries = data.get(section, [])
        if not isinstance(entries, list):
            raise _credential_error(path, f"{section} must be a list")
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise _credential_error(path, f"{section}[{index}] needs a name")
            body = entry.get(section[:-1])
            if body is not None and not isinstance(body, dict):
                raise _credential_error(path, f"{section}[{index}].{section[:-1]} must be "
                                              "a mapping")


async def login_from_environment() -> kopf.ConnectionInfo:
    """In-cluster service account, else kubeconfig; every failure is an :class:`InputError`.

    The message names the kubeconfig file and the problem in one line, so the operator
    stops at start-up with exit status 2 instead of a parser traceback.
    """
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings)
    if info is not None:
        return info
    paths = kubeconfig_paths()
    if not paths:
        raise InputError("no Kubernetes credentials: run in a cluster with a service "
                         "account, or set KUBECONFIG")
    for path in paths:
        _check_kubeconfig(path)
    where = ", ".join(paths)
    try:
        info = kopf.login_with_kubeconfig(settings=settings)
    except KeyError as error:
        # a context naming a cluster or user that no file defines, or a missing context
        missing = _one_line(error.args[0]) if error.args else "?"
        raise _credential_error(where, f"no entry named {missing!r} (check current-context, "
                                       "contexts, clusters and users)") from None
    except Exception as error:  # kopf's parser: any failure is the file's fault
        problem = _one_line(error) or type(error).__name__
        raise _credential_error(where, problem) from None
    if info is None:
        raise InputError("no Kubernetes credentials: run in a cluster with a service "
                         "account, or set KUBECONFIG")
    return info


def _pem(data: str | bytes) -> bytes:
    """kubeconfig ``*-data`` fields hold base64 of the PEM text (kopf passes them as is)."""
    raw = data.encode() if isinstance(data, str) else data
    if raw.lstrip().startswith(b"-----BEGIN"):
        return raw  # already PEM
    return base64.b64decode(raw)


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context()
    if info.ca_path:
        context.load_verify_locations(cafile=info.ca_path)
    elif info.ca_data:
        context.load_verify_locations(cadata=_pem(info.ca_data).decode())
    cert, key = info.certificate_path, info.private_key_path
    if info.certificate_data and info.private_key_data:
        # ssl only loads client certificates from files; kubeconfig may hold them inline.
        cert = _to_file(_pem(info.certificate_data))
        key = _to_file(_pem(info.private_key_data))
    if cert:
        context.load_cert_chain(certfile=cert, keyfile=key)
    return context


def _to_file(data: bytes) -> str:
    with tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False) as handle:
        handle.write(data)
        return handle.name


def _headers(info: kopf.ConnectionInfo) -> dict[str, str]:
    if info.token:
        return {"Authorization": f"{info.scheme or 'Bearer'} {info.token}"}
    return {}


class KubeClient:
    """get / merge-patch / create against the API server of a ConnectionInfo."""

    def __init__(self, login: Login, *, timeout: float = 30.0) -> None:
        self._login = login
        self._timeout = timeout
        self._client: httpx.AsyncClient | None = None

    async def _connect(self) -> httpx.AsyncClient:
        info = await self._login()
        auth = (info.username, info.password) if info.username and info.password else None
        return httpx.AsyncClient(
            base_url=info.server.rstrip("/"),
            headers=_headers(info),
            auth=auth,
            verify=_ssl_context(info),
            timeout=self._timeout,
            trust_env=info.trust_env,
        )

    async def _request(
        self, method: str, path: str, *, body: Any = None, content_type: str | None = None
    ) -> dict[str, Any]:
        for attempt in (1, 2):
            if self._client is None:
                self._client = await self._connect()
            headers = {"Content-Type": content_type} if content_type else {}
            try:
                response = await self._client.request(method, path, json=body, headers=headers)
            except httpx.HTTPError as error:
                raise KubeError(f"{method} {path}: {type(error).__name__}: {error}") from None
            if response.status_code == 401 and attempt == 1:
                await self._client.aclose()
                self._client = None  # a rotated token: log in again, once
                continue
            return _decode(method, path, response)
        raise AssertionError("unreachable")  # pragma: no cover

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when it does not exist."""
        try:
            return await self._request("GET", path)
        except KubeNotFound:
            return None

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a JSON merge patch; returns the object as the server now has it."""
        return await self._request("PATCH", path, body=dict(patch), content_type=MERGE_PATCH)

    async def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST a new object into the collection at ``path``."""
        return await self._request("POST", path, body=dict(obj))

    async def watch(
        self, path: str, *, resource_version: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events (``{"type", "object"}``) of the collection at ``path``.

        Without ``resource_version`` the server first sends every existing object as
        ADDED. The stream ends when the server closes it; failures are :class:`KubeError`
        (a 401 drops the connection so that the next call logs in again).
        """
        if self._client is None:
            self._client = await self._connect()
        params = {"watch": "true"}
        if resource_version:
            params["resourceVersion"] = resource_version
        timeout = httpx.Timeout(self._timeout, read=None)  # a quiet watch is not a failure
        try:
            async with self._client.stream("GET", path, params=params,
                                           timeout=timeout) as response:
                if not response.is_success:
                    await response.aread()
                    if response.status_code == 401:
                        await self.close()
                    _decode("WATCH", path, response)
                async for line in response.aiter_lines():
                    try:
                        event = json.loads(line) if line.strip() else None
                    except ValueError:
                        continue
                    if isinstance(event, dict):
                        yield event
        except httpx.HTTPError as error:
            raise KubeError(f"WATCH {path}: {type(error).__name__}: {error}") from None

    async def close(self) -> None:
        """Release the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _decode(method: str, path: str, response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json() if response.content else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    if response.is_success:
        return data
    message = str(data.get("message") or response.reason_phrase or "request failed")
    reason = data.get("reason") if isinstance(data.get("reason"), str) else None
    text = f"{method} {path}: HTTP {response.status_code}: {message}"
    status = response.status_code
    if status == 404:
        raise KubeNotFound(text, status=status, reason=reason)
    if status == 409:
        raise KubeConflict(text, status=status, reason=reason)
    raise KubeError(text, status=status, reason=reason)
