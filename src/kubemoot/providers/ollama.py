"""The Ollama adapter: the official ``ollama`` client behind :class:`ProviderClient`.

What Ollama reports (``/api/ps``: resident models with ``size_vram``, ``context_length``,
``digest``, ``expires_at``; ``/api/tags``: on-disk sizes and digests) becomes a
:class:`ProviderState`. What it does not report comes from the ModelProvider spec passed
in: the per-slot context (``OLLAMA_CONTEXT_LENGTH``), the parallel slots
(``OLLAMA_NUM_PARALLEL``), the reserve, and, without a DCGM exporter, the card's size.

Every httpx or ollama exception is mapped to :mod:`kubemoot.providers.protocol` errors
here, at the edge. Every public call has a deadline for the whole of it, because the
HTTP timeout bounds one read only. Only the probe's reads (``/api/ps``, ``/api/tags``,
``/api/version``) are retried on the same endpoint, at most ``max_retries`` times
(default once) and only when the connection was refused before anything was sent: they
change nothing, and a refusal during an engine restart should not mark the provider
down. Inference and load/unload requests are never repeated here: a refused one goes up
as :class:`ProviderUnavailable` with ``sent`` false, and the runtime places the call
once more *elsewhere* (DESIGN §5). A timeout, a reset or any answer is final, since the
engine may already be working on the request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import ollama
import pydantic

from kubemoot import metrics
from kubemoot.api.errors import InputError
from kubemoot.clock import Clock, SystemClock
from kubemoot.providers.dcgm import VramReading, fetch_dcgm_vram
from kubemoot.providers.protocol import (
    ChatResult,
    ModelNotFound,
    ProviderBadResponse,
    ProviderDeadlineExceeded,
    ProviderError,
    ProviderState,
    ProviderTimeout,
    ProviderUnavailable,
    ResidentModel,
)
from kubemoot.settings import DEFAULT_RESERVE_MIB, DEFAULTS

__all__ = ["MAX_RESPONSE_BYTES", "OllamaProvider", "parse_endpoint", "ps_entry_problem",
           "tags_entry_problem"]

T = TypeVar("T")
log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Ollama's answers are small JSON; a body this large is hostile or broken, and reading
# it whole would let one bad endpoint exhaust the prober's memory.
MAX_RESPONSE_BYTES = 16 * MIB
# Sizes beyond a pebibyte are not a GPU's; such a report is garbage, not a footprint.
_MAX_SANE_BYTES = 1 << 50


def parse_endpoint(text: str) -> tuple[str, str]:
    """``[name=]URL`` → ``(name, url)``; a URL without a scheme gets ``http://``.

    The name defaults to ``host:port``. Raises :class:`InputError` for anything that is
    not an http(s) URL with a host and a valid port.
    """
    name, sep, url = text.partition("=")
    if not sep:
        name, url = "", text
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise InputError(f"malformed endpoint {text!r}: {error}", field="endpoint") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(
        c.isspace() for c in url
    ):
        raise InputError(
            f"malformed endpoint {text!r}: expected [NAME=]http(s)://HOST[:PORT]",
            field="endpoint",
        )
    if port is None:
        port = 443 if parts.scheme == "https" else 11434
    normalized = f"{parts.scheme}://{parts.netloc if parts.port else f'{parts.netloc}:{port}'}"
    normalized += parts.path.rstrip("/")
    return (name.strip() or f"{parts.hostname}:{port}", normalized)


class _BodyTooLarge(Exception):
    pass


class _CappedStream(httpx.AsyncByteStream):
    """A response body that refuses to grow past a limit while it is being read."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise _BodyTooLarge(f"response body exceeds {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedTransport(httpx.AsyncBaseTransport):
    def __init__(self, limit: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self._limit),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def _clip(text: object, limit: int = 200) -> str:
    """A foreign message made safe to print: one line, bounded length."""
    flat = "".join(c if c.isprintable() else " " for c in str(text))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


_NOT_OLLAMA = "not an Ollama API endpoint"
_PROBE_CALLS = frozenset({"GET /api/ps", "GET /api/tags"})
_TITLE = re.compile(r"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def _foreign_body(body: object) -> str | None:
    """A short description of an error body that is not Ollama's; None when it may be.

    Empty bodies and HTML pages are foreign: the page's title (else its text) is kept,
    clipped to a short line, so a proxy's "502 Bad Gateway" still shows through.
    """
    # The head of a page is enough to recognise it and find its title.
    text = (str(body) if body is not None else "")[:4096].strip()
    if not text:
        return f"empty body; {_NOT_OLLAMA}"
    lowered = text[:512].lower()
    if not (text.startswith("<") or "<html" in lowered or "<!doctype" in lowered):
        return None
    found = _TITLE.search(text)
    words = " ".join(_TAG.sub(" ", found.group(1) if found else text).split())
    summary = f"HTML page {_clip(words, 80)!r}" if words else "an HTML page"
    return f"{summary}; {_NOT_OLLAMA}"


def _root_cause(error: BaseException) -> str:
    """The most specific message in an exception chain ("Connection refused")."""
    best = _clip(error)
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and (current.errno or current.strerror):
            # positive errnos are POSIX ("Connection refused"); resolver codes are not
            code = current.errno
            return _clip(os.strerror(code) if code is not None and code > 0
                         else current.strerror)
        if str(current) and not isinstance(current, ConnectionError):
            best = _clip(current)
        current = current.__cause__ or current.__context__
    return best


def _never_sent(error: BaseException) -> bool:
    """Whether the chain shows the connection failing before the request went out.

    The ollama client re-raises httpx's ``ConnectError`` as a bare ``ConnectionError``;
    the original survives as its context.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, httpx.ConnectError | ConnectionRefusedError):
            return True
        current = current.__cause__ or current.__context__
    return False


def _mib(size: object, what: str) -> int:
    if size is None:
        return 0
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < _MAX_SANE_BYTES:
        raise ProviderBadResponse(f"{what} is not a plausible size in bytes: {_clip(size)}")
    return math.ceil(size / MIB)


def _model_name(names: Mapping[str, object], where: str) -> str:
    """The first model name given in ``names`` (field → value); every one given must be
    a plain name. A name is printed in logs, on the dashboard and to every client that
    lists models: one carrying terminal escapes or line breaks is garbage, not a model."""
    name = ""
    for field, value in names.items():
        if value is None or value == "":
            continue
        if not isinstance(value, str) or not value.isprintable() or any(
                c.isspace() for c in value):
            raise ProviderBadResponse(
                f"{where} {field} is not a model name: {_clip(ascii(value), 80)}")
        name = name or value
    if not name:
        raise ProviderBadResponse(f"{where} lists a model without a name")
    return name


def _on_disk(entry: Any, name: object = None) -> tuple[str, int | None, str | None]:
    """One ``/api/tags`` entry → ``(name, size in MiB, digest)``; raises
    :class:`ProviderBadResponse` when it is not a plausible model. The client's type
    keeps ``model`` only; ``name`` is the raw entry's, where a caller has it."""
    name = _model_name({"model": entry.model, "name": name}, "/api/tags")
    size = _mib(entry.size, f"/api/tags size of {name}") if entry.size is not None else None
    return name, size, entry.digest or None


def _resident(entry: Any, disk_digests: Mapping[str, str]) -> ResidentModel:
    """One ``/api/ps`` entry → the copy it reports; raises :class:`ProviderBadResponse`
    when it is not a plausible one."""
    name = _model_name({"name": entry.name, "model": entry.model}, "/api/ps")
    vram = entry.size_vram if entry.size_vram is not None else entry.size
    context = entry.context_length
    if context is not None and context < 0:
        raise ProviderBadResponse(f"/api/ps context_length of {name} is negative")
    expires: datetime | None = entry.expires_at
    return ResidentModel(
        name=name,
        size_mib=_mib(vram, f"/api/ps size_vram of {name}"),
        context_length=context or None,
        digest=entry.digest or disk_digests.get(name),
        expires_at=expires.timestamp() if expires is not None else None,
    )


def _entry_problem(raw: object, shape: type[pydantic.BaseModel], where: str,
                   check: Callable[[Any, object], object]) -> str | None:
    if not isinstance(raw, dict):
        return f"{where} lists a value of type {type(raw).__name__}, not a model"
    try:
        check(shape.model_validate(raw), raw.get("name"))
    except pydantic.ValidationError as error:
        wrong = error.errors()[0]
        field = ".".join(str(part) for part in wrong["loc"])
        return (f"{where} {field}: {_clip(wrong['msg'], 120)}, given "
                f"{_clip(ascii(wrong['input']), 80)}")
    except ProviderBadResponse as error:
        return str(error)
    return None


def ps_entry_problem(raw: object) -> str | None:
    """Why the prober would refuse one raw ``/api/ps`` entry, naming the field; None
    when it would accept it. The prober's own checks (the official client's types, then
    :func:`_resident`), so a listing that passes an engine's entries on (the gateway's
    ``/api/ps``) shows exactly the copies the prober accepts."""
    return _entry_problem(raw, ollama.ProcessResponse.Model, "/api/ps",
                          lambda entry, _: _resident(entry, {}))


def tags_entry_problem(raw: object) -> str | None:
    """As :func:`ps_entry_problem`, for one ``/api/tags`` entry."""
    return _entry_problem(raw, ollama.ListResponse.Model, "/api/tags", _on_disk)


class OllamaProvider:
    """One Ollama server (or anything speaking its API, such as the emulator)."""

    def __init__(
        self,
        name: str,
        endpoint: str,
        *,
        context_length: int | None = None,
        num_parallel: int = 1,
        reserve_mib: int = DEFAULT_RESERVE_MIB,
        total_vram_mib: int | None = None,
        timeout: float = DEFAULTS.provider_read_timeout_seconds,
        deadline: float = DEFAULTS.provider_call_deadline_seconds,
        max_retries: int = 1,
        retry_delay: float = 0.5,
        clock: Clock | None = None,
        dcgm_url: str | None = None,
        dcgm_gpu: str | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.name = name
        self.endpoint = endpoint.rstrip("/")
        self.context_length = context_length
        self.num_parallel = num_parallel
        self.reserve_mib = reserve_mib
        self.total_vram_mib = total_vram_mib
        # The deployment's timeouts come in as values: the process's client factory
        # (kubemoot.providers.factory) passes what its entry point read.
        self.timeout = timeout
        self.deadline = deadline
        if not self.deadline > 0:
            raise InputError(f"provider {name}: the call deadline must be positive, got "
                             f"{self.deadline!r}", field="deadline")
        self.max_retries = max(0, max_retries)
        self.retry_delay = retry_delay
        self.dcgm_url = dcgm_url
        self.dcgm_gpu = dcgm_gpu
        self.last_dcgm_error: ProviderError | None = None
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._client = ollama.AsyncClient(
            host=self.endpoint, timeout=self.timeout,
            transport=_CappedTransport(max_response_bytes),
        )

    async def __aenter__(self) -> OllamaProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()  # type: ignore[no-untyped-call]

    # -- error mapping and bounded retry -------------------------------------------

    def _map(self, error: Exception, what: str) -> ProviderError:
        where: dict[str, Any] = {"provider": self.name, "endpoint": self.endpoint}
        if isinstance(error, ProviderError):
            error.provider = error.provider or self.name
            error.endpoint = error.endpoint or self.endpoint
            return error
        if isinstance(error, ollama.ResponseError):
            return self._map_status(error, what, where)
        if isinstance(error, httpx.TimeoutException):
            return ProviderTimeout(f"{what}: no answer within {self.timeout:g} s", **where)
        if isinstance(error, ConnectionError | httpx.ConnectError | httpx.ReadError
                      | httpx.WriteError | httpx.CloseError):
            # the ollama client replaces httpx's ConnectError with a generic message;
            # the original (e.g. "Connection refused") survives as the context
            return ProviderUnavailable(f"{what}: cannot connect: {_root_cause(error)}",
                                       sent=not _never_sent(error), **where)
        if isinstance(error, httpx.RemoteProtocolError):
            return ProviderBadResponse(f"{what}: broken HTTP answer: {_clip(error)}", **where)
        if isinstance(error, _BodyTooLarge):
            return ProviderBadResponse(f"{what}: {error}", **where)
        if isinstance(error, ValueError | TypeError | KeyError | AttributeError
                      | RecursionError):
            # JSON decode errors and pydantic validation errors are ValueErrors
            return ProviderBadResponse(
                f"{what}: malformed body: {type(error).__name__}: {_clip(error)}", **where
            )
        if isinstance(error, httpx.HTTPError):
            return ProviderUnavailable(f"{what}: {_clip(error)}", **where)
        if isinstance(error, ollama.RequestError):
            return ProviderError(f"{what}: {_clip(error)}", **where)
        return ProviderBadResponse(
            f"{what}: unexpected {type(error).__name__}: {_clip(error)}", **where
        )

    def _map_status(
        self, error: ollama.ResponseError, what: str, where: dict[str, Any]
    ) -> ProviderError:
        """An HTTP error status, said as ``HTTP 404 from GET /api/ps: …`` in one line.

        Ollama answers errors as JSON ``{"error": …}``; the client unwraps that. A body
        that is empty or an HTML page came from something else (a web server, a proxy's
        error page), so it is summarised, never printed raw.
        """
        status = error.status_code
        foreign = _foreign_body(error.error)
        prefix = f"HTTP {status} from {what}"
        if status == 404 and (foreign or what in _PROBE_CALLS):
            # Ollama always serves /api/ps and /api/tags and names the model in its
            # 404s; a bare 404 means the URL points at something that is not Ollama.
            return ProviderBadResponse(f"{prefix}: {_NOT_OLLAMA}", status=status, **where)
        said = _clip(" ".join(str(error.error).split()), 120)
        if status == 404:
            return ModelNotFound(f"{what}: {said}", **where)
        detail = foreign or said
        if status >= 500 or status < 0:
            return ProviderBadResponse(f"{prefix}: {detail}", status=status, **where)
        return ProviderError(f"{prefix}: {detail}", **where)

    async def _call(
        self, what: str, op: Callable[[], Awaitable[T]], *, retry: bool = False
    ) -> T:
        """Run one request, mapping its errors; ``retry`` (probe reads only) repeats a
        request whose connection was refused, on this same endpoint."""
        attempts = 1 + (self.max_retries if retry else 0)
        for attempt in range(1, attempts + 1):
            try:
                return await op()
            except Exception as error:
                mapped = self._map(error, what)
                # Only a request that never left may be repeated: after a timeout or a
                # reset the engine may still be running the first one.
                retryable = isinstance(mapped, ProviderUnavailable) and not mapped.sent
                if not retryable or attempt == attempts:
                    raise mapped from None
                log.info("%s: retrying once after %s", self.name, mapped)
                await self._clock.sleep(self.retry_delay)
        raise AssertionError("unreachable")  # pragma: no cover

    @asynccontextmanager
    async def _within_deadline(self, what: str) -> AsyncIterator[None]:
        """Bound a whole call, every read and retry of it, by :attr:`deadline`.

        Real time on purpose: the deadline guards a real socket, whatever clock the
        runtime above runs on.
        """
        bound = asyncio.timeout(self.deadline)
        try:
            async with bound:
                yield
        except TimeoutError:
            if not bound.expired():
                raise
            raise ProviderDeadlineExceeded(
                f"{what}: not finished within the {self.deadline:g} s deadline",
                provider=self.name, endpoint=self.endpoint,
            ) from None

    # -- ProviderClient ------------------------------------------------------------

    async def probe(self) -> ProviderState:
        """Ask ``/api/ps`` and ``/api/tags`` (and DCGM) what the engine holds now."""
        async with self._within_deadline("probe"):
            ps = await self._call("GET /api/ps", self._client.ps, retry=True)
            tags = await self._call("GET /api/tags", self._client.list, retry=True)
            try:
                state = await self._state(ps, tags)
            except ProviderError as error:
                raise self._map(error, "probe") from None
            state.runtime_version = await self.runtime_version()
            return state

    async def runtime_version(self) -> str | None:
        """``/api/version``; None when the engine does not say (the runtime gate's UNKNOWN)."""
        try:
            response = await self._call(
                "GET /api/version",
                lambda: self._client._request_raw("GET", "/api/version"),  # type: ignore[no-untyped-call]
                retry=True,
            )
            data = response.json()
        except (ProviderError, ValueError):
            return None
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) and version.strip() else None

    async def _state(self, ps: Any, tags: Any) -> ProviderState:
        disk_sizes: dict[str, int] = {}
        disk_digests: dict[str, str] = {}
        for entry in tags.models:
            name, size, digest = _on_disk(entry)
            if size is not None:
                disk_sizes[name] = size
            if digest:
                disk_digests[name] = digest
        loaded = [_resident(entry, disk_digests) for entry in ps.models]
        reading = await self._read_dcgm()
        resident = sum(m.size_mib for m in loaded)
        return ProviderState(
            provider=self.name,
            endpoint=self.endpoint,
            ready=True,
            last_probed_at=self._clock.now(),
            total_vram_mib=reading.total_mib if reading else self.total_vram_mib,
            used_vram_mib=reading.used_mib if reading else resident,
            reserve_mib=self.reserve_mib,
            max_parallel=self.num_parallel,
            context_length=self.context_length,
            loaded_models=loaded,
            loaded_model_footprints={m.name: m.size_mib for m in loaded},
            disk_sizes_mib=disk_sizes,
        )

    async def _read_dcgm(self) -> VramReading | None:
        """DCGM is optional evidence: when it fails the total falls back to the spec."""
        if self.dcgm_url is None:
            return None
        try:
            reading = await fetch_dcgm_vram(self.dcgm_url, gpu=self.dcgm_gpu,
                                            timeout=min(self.timeout, 10.0))
        except ProviderError as error:
            self.last_dcgm_error = error
            fallback = ("the VRAM total stays unknown" if self.total_vram_mib is None
                        else f"using the configured VRAM total ({self.total_vram_mib} MiB)")
            metrics.survived("provider", "dcgm", metrics.PROVIDER,
                             f"{self.name}: DCGM unavailable, {fallback}", error,
                             logger=log)
            return None
        self.last_dcgm_error = None
        return reading

    async def preload(self, model: str, *, num_ctx: int | None = None,
                      keep_alive: float | str | None = None) -> None:
        """``/api/generate`` with no prompt loads the model and returns."""
        ctx = num_ctx if num_ctx is not None else self.context_length
        options = {"num_ctx": ctx} if ctx is not None else None
        async with self._within_deadline(f"preload {model}"):
            await self._call(
                f"preload {model}",
                lambda: self._client.generate(model=model, options=options,
                                              keep_alive=keep_alive),
            )

    async def unload(self, model: str) -> None:
        """``keep_alive: 0`` asks the engine to drop the model as soon as it is idle."""
        async with self._within_deadline(f"unload {model}"):
            await self._call(
                f"unload {model}", lambda: self._client.generate(model=model, keep_alive=0)
            )

    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        num_ctx: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: Mapping[str, Any] | None = None,
        keep_alive: float | None = None,
    ) -> ChatResult:
        """One non-streaming ``/api/chat``; ``num_ctx`` goes into ``options``."""
        merged: dict[str, Any] = dict(options or {})
        if num_ctx is not None:
            merged["num_ctx"] = num_ctx
        async with self._within_deadline(f"chat {model}"):
            response = await self._call(
                f"chat {model}",
                lambda: self._client.chat(
                    model=model, messages=list(messages),
                    tools=list(tools) if tools else None,
                    options=merged or None, stream=False, keep_alive=keep_alive,
                ),
            )
        try:
            message = response.message
            calls = [c.model_dump(exclude_none=True) for c in (message.tool_calls or [])]
            return ChatResult(
                model=response.model or model,
                content=message.content or "",
                tool_calls=calls,
                prompt_eval_count=response.prompt_eval_count,
                eval_count=response.eval_count,
                done_reason=response.done_reason,
                compute_seconds=_compute_seconds(response.total_duration,
                                                 response.load_duration),
            )
        except Exception as error:
            raise self._map(error, f"chat {model}") from None


def _compute_seconds(total_ns: int | None, load_ns: int | None) -> float | None:
    """The engine's time on a reply after its load, from its nanosecond durations."""
    if total_ns is None:
        return None
    return max(0, total_ns - (load_ns or 0)) / 1e9
