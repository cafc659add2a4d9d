"""Reloading the gateway's config file: on SIGHUP and when the file changes.

The file's modification time (and size) is looked at once per probe tick — no watcher
thread, no busy loop — and a SIGHUP reloads at once. A file that does not read, or
does not check, leaves the running config as it was and logs one error naming the
file and the field; the next change of the file is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kubemoot.api.errors import InputError
from kubemoot.api.loader import load_bundle
from kubemoot.api.model import Model
from kubemoot.api.modelclass import ModelClass
from kubemoot.api.provider import ModelProvider
from kubemoot.gateway.app import VirtualModels
from kubemoot.gateway.classes import ModelClassBook
from kubemoot.gateway.config import (
    GatewayConfig,
    Limits,
    ProviderSource,
    load_config,
    parse_provider,
)
from kubemoot.gateway.keys import ApiKeys
from kubemoot.gateway.server import GatewayServer
from kubemoot.providers.ollama import parse_endpoint
from kubemoot.settings import DEFAULTS, GatewaySettings

__all__ = ["ConfigReloader", "GatewayFleet", "assemble_fleet"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GatewayFleet:
    """What a config reading means to a running gateway (flags and bundles included)."""

    providers: list[ProviderSource]
    declared: dict[str, int | None]
    virtual: VirtualModels | None
    keys: ApiKeys | None
    settings: GatewaySettings


def assemble_fleet(
    config: GatewayConfig | None, *, urls: Sequence[str] = (),
    files: Sequence[str | Path] = (), flag_keys: ApiKeys | None = None,
    flag_limits: Limits | None = None, tolerance: float = DEFAULTS.candidate_tolerance,
    base: GatewaySettings | None = None,
) -> GatewayFleet:
    """The providers, declared sizes, ModelClasses, keys and limits of ``--provider``,
    ``-f`` and ``-c`` together (flags over the config's limits, the config over the
    defaults)."""

    sources: dict[str, ProviderSource] = {}
    declared: dict[str, int | None] = {}
    models: list[Model] = []
    providers: list[ModelProvider] = []
    classes: list[ModelClass] = []

    def add(source: ProviderSource, field: str) -> None:
        if source.name in sources:
            raise InputError(f"the provider name {source.name!r} is given twice",
                             field=field)
        sources[source.name] = source

    if config is not None:
        for source in config.providers:
            add(source, f"servers.{source.name}")
        models += config.models
        providers += config.provider_resources
        classes += config.classes
    if files:
        bundle = load_bundle(files)
        pinned: dict[str, list[str]] = {}
        for m in bundle.models:
            if m.spec.pinned:
                pinned.setdefault(m.spec.provider_ref, []).append(m.spec.model)
        for p in bundle.providers:
            capacity = p.status.capacity if p.status is not None else None
            add(ProviderSource(
                p.metadata.name, parse_endpoint(p.spec.endpoint)[1],
                context_length=p.spec.context_length, num_parallel=p.spec.num_parallel or 1,
                reserve_mib=p.spec.reserve_mib,
                total_vram_mib=capacity.vram_total_mib if capacity else None,
                pinned=tuple(pinned.get(p.metadata.name, ()))), "--file")
        models += bundle.models
        providers += bundle.providers
        classes += bundle.model_classes
    for text in urls:
        add(parse_provider(text), "--provider")
    for m in models:
        if m.spec.vram_mib is not None or m.spec.model not in declared:
            declared[m.spec.model] = m.spec.vram_mib
    virtual = (ModelClassBook(classes, models, providers, runtime_tolerance=tolerance)
               if classes else None)
    if flag_keys is not None and config is not None and config.keys is not None:
        raise InputError("keys are given twice: in --api-keys and under keys: in "
                         f"{config.path}; keep one", field="--api-keys")
    keys = flag_keys
    if config is not None and config.keys is not None:
        keys = ApiKeys(dict(config.keys))
    settings = base or GatewaySettings()
    for limits in (config.limits if config is not None else None, flag_limits):
        if limits is None:
            continue
        if limits.wait_limit_seconds is not None:
            settings = replace(settings, wait_limit_seconds=limits.wait_limit_seconds)
        if limits.max_keep_alive_seconds is not None:
            settings = replace(settings, max_keep_alive_seconds=limits.max_keep_alive_seconds)
        if limits.probe_interval_seconds is not None:
            settings = replace(settings, provider_probe_seconds=limits.probe_interval_seconds)
    return GatewayFleet(list(sources.values()), declared, virtual, keys, settings)


Build = Callable[[GatewayConfig], GatewayFleet]
"""``build(config)``: the whole fleet for one reading of the file; InputError if bad."""


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


class ConfigReloader:
    """Reloads ``path`` into ``server``; :meth:`check` is the probe tick's hook."""

    def __init__(self, path: str | Path, server: GatewayServer, build: Build, *,
                 announce: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self.server = server
        self._build = build
        self._announce = announce or (lambda line: log.info("%s", line))
        self._stamp = _stamp(self.path)
        self._lock = asyncio.Lock()
        self.reloads = 0  # reloads applied (a test waits on it)
        self.failures = 0  # readings refused

    async def check(self) -> None:
        """Reload when the file's modification time or size changed since last read."""
        if _stamp(self.path) != self._stamp:
            await self.reload("the file changed")

    async def reload(self, why: str) -> bool:
        """Read the file and apply it; False (old config kept, error logged) when bad."""
        async with self._lock:
            # stamped before reading: a bad file is reported once, not at every tick
            self._stamp = _stamp(self.path)
            try:
                fleet = self._build(load_config(self.path))
            except InputError as error:
                self.failures += 1
                log.error("gateway: not reloading %s (%s), the running config stays: %s",
                          self.path, why, error.describe())
                return False
            try:
                changes = await self.server.reconfigure(
                    providers=fleet.providers, declared=fleet.declared,
                    virtual=fleet.virtual, keys=fleet.keys, settings=fleet.settings)
            except Exception as error:  # the store or a server failed midway
                self.failures += 1
                log.error("gateway: applying %s (%s) failed midway: %s: %s", self.path, why,
                          type(error).__name__, error)
                return False
            self.reloads += 1
            self._announce(f"gateway: reloaded {self.path} ({why}): "
                           f"{'; '.join(changes) or 'nothing changed'}")
            return True
