"""The gateway's config file (``kubemoot gateway -c gateway.yaml``) and ``--provider``.

A homelab writes its fleet by hand, so the file is plain YAML, not Kubernetes
resources::

    servers:
      big:
        url: http://192.168.1.20:11434
        vramMiB: 24576          # Ollama does not report its card's memory
        numParallel: 2          # OLLAMA_NUM_PARALLEL as set on that server
        contextLength: 8192     # OLLAMA_CONTEXT_LENGTH
        labels: {room: study}
    models:
      qwen3:14b:
        vramMiB: 11264          # declared size, until the model is seen loaded
        labels: {capability/code: "true"}
        pinned: [big]           # kept loaded on these servers
    classes:
      coder:                    # a virtual model name (a ModelClass spec)
        require: {matchLabels: {capability/code: "true"}}
    keys:
      alice: sk-alice-key
    limits:
      waitLimit: 90s
      maxKeepAlive: 30m
      probeInterval: 5s

Both spellings of a mebibyte field (``vramMiB``, ``vramMib``) are read, in the file,
in ``--provider`` and in resources; output says ``MiB``. One parser reads
``--provider NAME=URL,vramMiB=N,…`` for the gateway and for ``kubemoot probe``. Every
mistake is an :class:`~kubemoot.api.errors.InputError` naming the file and field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from kubemoot.api.bounds import ContextTokens, Mib, Parallel
from kubemoot.api.errors import InputError
from kubemoot.api.loader import input_error_from_validation
from kubemoot.api.meta import Strict, other_mib_spelling
from kubemoot.api.model import Model
from kubemoot.api.modelclass import ModelClass, ModelClassSpec
from kubemoot.api.provider import ModelProvider
from kubemoot.providers.durations import DurationError, duration_seconds
from kubemoot.providers.ollama import parse_endpoint
from kubemoot.settings import DEFAULTS

__all__ = [
    "PROVIDER_KEYS",
    "GatewayConfig",
    "Limits",
    "ProviderSource",
    "load_config",
    "parse_config",
    "parse_provider",
    "split_provider",
]


@dataclass(frozen=True, slots=True)
class ProviderSource:
    """A provider the gateway probes: ``--provider``, a config's server, or a bundle's
    ModelProvider."""

    name: str
    endpoint: str
    context_length: int | None = None
    num_parallel: int = 1
    reserve_mib: int = DEFAULTS.reserve_mib
    total_vram_mib: int | None = None
    # models kept loaded here (Model.spec.pinned, a config model's ``pinned``)
    pinned: tuple[str, ...] = ()


# What ``--provider URL,key=value…`` may say; Ollama reports none of these itself.
PROVIDER_KEYS = ("vramMiB", "numParallel", "contextLength", "reserveMiB")


def parse_provider(text: str, *, flag: str = "--provider") -> ProviderSource:
    """``[NAME=]URL[,vramMiB=N][,numParallel=N][,contextLength=N][,reserveMiB=N]``."""
    name, url, values = split_provider(text, flag=flag)
    return ProviderSource(
        name, url, context_length=values.get("contextLength"),
        num_parallel=values.get("numParallel", 1),
        reserve_mib=values.get("reserveMiB", DEFAULTS.reserve_mib),
        total_vram_mib=values.get("vramMiB"))


def split_provider(text: str, *, flag: str = "--provider") -> tuple[str, str, dict[str, int]]:
    """``--provider``'s name, URL and the settings it gives (keys of PROVIDER_KEYS)."""
    endpoint, *settings = text.split(",")
    try:
        name, url = parse_endpoint(endpoint)
    except InputError as error:
        raise InputError(error.message, field=flag) from None
    values: dict[str, int] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        key = key.strip()
        if key not in PROVIDER_KEYS and other_mib_spelling(key) in PROVIDER_KEYS:
            key = other_mib_spelling(key) or key  # vramMib means vramMiB
        if not sep or key not in PROVIDER_KEYS or not value.strip().isdigit():
            raise InputError(f"{item!r} in {text!r} is not one of "
                             f"{', '.join(k + '=N' for k in PROVIDER_KEYS)}", field=flag)
        if key in values:
            raise InputError(f"{key} is given twice in {text!r}", field=flag)
        values[key] = int(value)
    for key in ("numParallel", "contextLength"):
        if values.get(key) == 0:
            raise InputError(f"{key} must be at least 1 in {text!r}", field=flag)
    return name, url, values


# -- the file's shape ------------------------------------------------------------------


class ServerEntry(Strict):
    url: str = Field(min_length=1)
    vram_mib: Mib | None = Field(default=None, alias="vramMiB")
    reserve_mib: Mib = Field(default=DEFAULTS.reserve_mib, alias="reserveMiB")
    num_parallel: Parallel = Field(default=1, alias="numParallel")
    context_length: ContextTokens | None = Field(default=None, alias="contextLength")
    labels: dict[str, str] = Field(default_factory=dict)


class ModelEntry(Strict):
    vram_mib: Mib | None = Field(default=None, alias="vramMiB")
    labels: dict[str, str] = Field(default_factory=dict)
    servers: list[str] | None = None  # where it is (for classes); None: every server
    pinned: list[str] = Field(default_factory=list)


class LimitsEntry(Strict):
    wait_limit: str | float | None = Field(default=None, alias="waitLimit")
    max_keep_alive: str | float | None = Field(default=None, alias="maxKeepAlive")
    probe_interval: str | float | None = Field(default=None, alias="probeInterval")


class ConfigFile(Strict):
    servers: dict[str, ServerEntry] = Field(default_factory=dict)
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    classes: dict[str, ModelClassSpec] = Field(default_factory=dict)
    keys: dict[str, str] | None = None
    limits: LimitsEntry = Field(default_factory=LimitsEntry)

    @field_validator("servers", "models", "classes", "limits", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return {} if value is None else value  # "servers:" with nothing under it


# -- what the file means ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """The config's limits in seconds; None: the flag's (or the default) stands."""

    wait_limit_seconds: float | None = None
    max_keep_alive_seconds: float | None = None
    probe_interval_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """One reading of the config file."""

    path: str
    providers: tuple[ProviderSource, ...] = ()
    # resources for the ModelClass machinery and the declared sizes
    provider_resources: tuple[ModelProvider, ...] = ()
    models: tuple[Model, ...] = ()
    classes: tuple[ModelClass, ...] = ()
    keys: Mapping[str, str] | None = None
    limits: Limits = field(default_factory=Limits)


def load_config(path: str | Path) -> GatewayConfig:
    """Read and check ``path``; :class:`InputError` naming the file and the field."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read the gateway config: {error}", file=where) from None
    return parse_config(text, file=where)


def parse_config(text: str, *, file: str) -> GatewayConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InputError(f"not YAML: {str(error).splitlines()[0]}", file=file) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError("the config must be a mapping (servers:, models:, …)", file=file)
    try:
        parsed = ConfigFile.model_validate(data)
    except ValidationError as error:
        raise input_error_from_validation(error, file=file) from None
    return _meaning(parsed, file)


def _meaning(parsed: ConfigFile, file: str) -> GatewayConfig:
    servers = parsed.servers
    pinned: dict[str, list[str]] = {name: [] for name in servers}
    models: list[Model] = []
    for model, entry in parsed.models.items():
        where = entry.servers if entry.servers is not None else list(servers)
        for index, host in enumerate([*where, *entry.pinned]):
            if host not in servers:
                part = "servers" if index < len(where) else "pinned"
                raise InputError(f"no server named {host!r} under servers:", file=file,
                                 field=f"models[{model}].{part}")
        for host in entry.pinned:
            pinned[host].append(model)
        for host in sorted(set(where) | set(entry.pinned)):
            models.append(_model_resource(model, host, entry, file))
    providers = []
    resources = []
    for name, server in servers.items():
        try:
            source = parse_provider(f"{name}={server.url}", flag=f"servers.{name}.url")
        except InputError as error:
            raise InputError(error.message, file=file, field=error.field) from None
        providers.append(ProviderSource(
            name, source.endpoint, context_length=server.context_length,
            num_parallel=server.num_parallel, reserve_mib=server.reserve_mib,
            total_vram_mib=server.vram_mib, pinned=tuple(pinned[name])))
        resources.append(_provider_resource(name, server, file))
    classes = []
    for name, spec in parsed.classes.items():
        try:
            classes.append(ModelClass.model_validate(
                {"metadata": {"name": name}, "spec": spec.model_dump(by_alias=True,
                                                                     exclude_none=True)}))
        except ValidationError as error:
            raise input_error_from_validation(error, file=file,
                                              prefix=f"classes.{name}") from None
    keys = dict(parsed.keys) if parsed.keys is not None else None
    if keys is not None:
        _check_keys(keys, file)
    return GatewayConfig(file, tuple(providers), tuple(resources), tuple(models),
                         tuple(classes), keys, _limits(parsed.limits, file))


def _resource_name(*parts: str) -> str:
    """A DNS-subdomain name from model and server names (``qwen3:14b`` → ``qwen3-14b``)."""
    text = "-".join(parts).lower()
    cleaned = "".join(c if c.isalnum() or c in "-." else "-" for c in text).strip("-.")
    return cleaned[:253] or "model"


def _model_resource(model: str, server: str, entry: ModelEntry, file: str) -> Model:
    spec: dict[str, Any] = {"model": model, "providerRef": server}
    if entry.vram_mib is not None:
        spec["vramMiB"] = entry.vram_mib
    if server in entry.pinned:
        spec["pinned"] = True
    try:
        return Model.model_validate({"metadata": {"name": _resource_name(model, server),
                                                  "labels": entry.labels}, "spec": spec})
    except ValidationError as error:
        raise input_error_from_validation(error, file=file,
                                          prefix=f"models[{model}]") from None


def _provider_resource(name: str, server: ServerEntry, file: str) -> ModelProvider:
    spec: dict[str, Any] = {"endpoint": server.url, "reserveMiB": server.reserve_mib,
                            "numParallel": server.num_parallel}
    if server.context_length is not None:
        spec["contextLength"] = server.context_length
    status = ({"capacity": {"vramTotalMiB": server.vram_mib}}
              if server.vram_mib is not None else None)
    try:
        return ModelProvider.model_validate({
            "metadata": {"name": name, "labels": server.labels}, "spec": spec,
            **({"status": status} if status else {})})
    except ValidationError as error:
        raise input_error_from_validation(error, file=file,
                                          prefix=f"servers.{name}") from None


def _check_keys(keys: Mapping[str, str], file: str) -> None:
    seen: set[str] = set()
    for name, key in keys.items():
        if not key.strip():
            raise InputError("the key is empty", file=file, field=f"keys.{name}")
        if key in seen:
            raise InputError("this key is also another name's key", file=file,
                             field=f"keys.{name}")
        seen.add(key)
    if not keys:
        raise InputError("keys: is given but holds no key", file=file, field="keys")


def _limits(entry: LimitsEntry, file: str) -> Limits:
    def seconds(value: str | float | None, name: str) -> float | None:
        if value is None:
            return None
        try:
            # InputError names the field already; the parser's own words would repeat it
            found = duration_seconds(value, field="the value")
        except DurationError as error:
            raise InputError(str(error), file=file, field=f"limits.{name}") from None
        if found == math.inf:
            raise InputError(f"must not be negative, got {value!r}", file=file,
                             field=f"limits.{name}")
        return found

    interval = seconds(entry.probe_interval, "probeInterval")
    if interval is not None and interval <= 0:
        raise InputError("must be more than 0 s", file=file, field="limits.probeInterval")
    return Limits(seconds(entry.wait_limit, "waitLimit"),
                  seconds(entry.max_keep_alive, "maxKeepAlive"), interval)
