"""Kubernetes Events the operator emits (``FailedScheduling``, ``InvalidSpec``, ``ProbeFailed``).

Events are the operator's way of telling ``kubectl describe`` users what happened. An
event that cannot be posted is logged and dropped: losing an event must never stop a
reconcile. Events of cluster-scoped objects (Model, ModelProvider, MootArchetype) go to
the ``default`` namespace, where ``kubectl describe`` looks for them.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

from kubemoot.api import API_VERSION
from kubemoot.clock import Clock
from kubemoot.operator.kube import KubeClient, KubeError, events_path
from kubemoot.operator.status import rfc3339, to_datetime

__all__ = ["COMPONENT", "EventRecorder", "ObjectRef"]

log = logging.getLogger(__name__)

COMPONENT = "kubemoot-operator"
# Kubernetes caps an event message at 1 KiB; the tail of a long message is the least useful.
_MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """What an event is about."""

    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None
    api_version: str = API_VERSION

    @classmethod
    def of(cls, body: Any, *, kind: str | None = None) -> ObjectRef:
        """The reference of a raw object (a kopf body or a dict from the API)."""
        metadata = body.get("metadata") or {}
        return cls(
            kind=str(kind or body.get("kind") or "?"),
            name=str(metadata.get("name") or "?"),
            namespace=metadata.get("namespace"),
            uid=metadata.get("uid"),
            api_version=str(body.get("apiVersion") or API_VERSION),
        )

    def to_wire(self) -> dict[str, Any]:
        data: dict[str, Any] = {"apiVersion": self.api_version, "kind": self.kind,
                                "name": self.name}
        if self.namespace:
            data["namespace"] = self.namespace
        if self.uid:
            data["uid"] = self.uid
        return data


class EventRecorder:
    """Posts core/v1 Events; never raises."""

    def __init__(
        self, client: KubeClient, *, clock: Clock, cluster_namespace: str = "default"
    ) -> None:
        self._client = client
        self._clock = clock
        self._cluster_namespace = cluster_namespace
        self._instance = os.environ.get("HOSTNAME", COMPONENT)
        self.posted: list[dict[str, Any]] = []

    async def emit(self, regarding: ObjectRef, *, type: str, reason: str, message: str) -> None:
        """Post one event about ``regarding``."""
        namespace = regarding.namespace or self._cluster_namespace
        now = rfc3339(to_datetime(self._clock.now()))
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            # Named like the API server names them: object name, a dot, a unique suffix.
            "metadata": {"name": f"{regarding.name}.{uuid.uuid4().hex[:16]}",
                         "namespace": namespace},
            "involvedObject": regarding.to_wire(),
            "type": type,
            "reason": reason,
            "message": message[:_MAX_MESSAGE],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._client.create(events_path(namespace), event)
        except KubeError as error:
            log.warning("could not post event %s on %s/%s: %s", reason, regarding.kind,
                        regarding.name, error)
            return
        self.posted.append(event)
