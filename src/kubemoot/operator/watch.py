"""Watching the crews' Deployments, one namespace at a time.

The operator templates the ``KUBEMOOT_*`` env of a Deployment the crew owns. A crew
may create that Deployment after its Agent was bound, or recreate it; the operator must
notice without anyone touching the Agent. kopf watches our own kinds; Deployments are
watched here, and only in the namespaces that hold Agents, so the operator needs
Deployment rights in the crews' namespaces (a Role per crew), never cluster-wide.

A watch ends when the server closes it (API servers do after a few minutes) and is
opened again, from the last resourceVersion seen when there is one; a failure waits
:data:`WATCH_RETRY_SECONDS` of the injected clock before the next try.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from kubemoot.clock import Clock
from kubemoot.operator.kube import KubeClient, KubeError, deployments_path

__all__ = ["WATCH_RETRY_SECONDS", "DeploymentWatch", "OnDeployment"]

log = logging.getLogger(__name__)

#: Seconds between two attempts to open a watch that failed or closed at once.
WATCH_RETRY_SECONDS = 5.0

#: Called with (event type, namespace, Deployment body) for every watch event.
OnDeployment = Callable[[str, str, Mapping[str, Any]], Awaitable[None]]


class DeploymentWatch:
    """One Deployment watch per namespace in :meth:`follow`'s latest set."""

    def __init__(
        self,
        kube: KubeClient,
        on_event: OnDeployment,
        *,
        clock: Clock,
        retry_seconds: float = WATCH_RETRY_SECONDS,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.retry_seconds = retry_seconds
        self._on_event = on_event
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopped: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def namespaces(self) -> set[str]:
        """The namespaces watched now."""
        return set(self._tasks)

    def follow(self, namespaces: Collection[str]) -> None:
        """Watch exactly ``namespaces``: open the missing watches, close the others."""
        if self._closed:
            return
        wanted = set(namespaces)
        for namespace in sorted(set(self._tasks) - wanted):
            self._tasks.pop(namespace).cancel()
        for namespace in sorted(wanted - set(self._tasks)):
            self._tasks[namespace] = asyncio.create_task(
                self._run(namespace), name=f"kubemoot-deployments-{namespace}"
            )

    def stop(self) -> None:
        """Cancel every watch now (the operator is stopping); :meth:`close` waits for them."""
        self._closed = True
        self._stopped += list(self._tasks.values())
        self._tasks.clear()
        for task in self._stopped:
            task.cancel()

    async def close(self) -> None:
        """Stop every watch and wait for them to end."""
        self.stop()
        tasks, self._stopped = self._stopped, []
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, namespace: str) -> None:
        version: str | None = None
        while True:
            received = 0
            try:
                async for event in self.kube.watch(deployments_path(namespace),
                                                   resource_version=version):
                    received += 1
                    kind = str(event.get("type") or "")
                    body = event.get("object")
                    if not isinstance(body, Mapping):
                        continue
                    if kind == "ERROR":  # e.g. 410 Gone: the version is too old
                        version = None
                        break
                    seen = (body.get("metadata") or {}).get("resourceVersion")
                    version = seen if isinstance(seen, str) and seen else version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        await self._on_event(kind, namespace, body)
            except KubeError as error:
                log.warning("watching the Deployments of %s failed: %s", namespace, error)
                received = 0
            except Exception:  # a bug in a handler must not end the watch
                log.exception("handling a Deployment of %s failed", namespace)
            if received == 0:
                await self.clock.sleep(self.retry_seconds)
