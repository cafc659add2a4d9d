"""The Kubemoot operator: kopf handlers that keep a cluster's custom resources in step.

* ModelProvider: a probe loop (``--probe-interval``) writes ``status.ready``,
  ``status.lastProbedAt``, ``status.capacity`` and a ``Ready`` condition, and publishes
  the provider-state document to the shared KV for the agent runtime.
* Model: ``status.ready`` and ``status.footprintMiB`` from its provider's probe.
* Agent: scheduled with :mod:`kubemoot.scheduling`; ``status.scheduling``, conditions
  and the ``KUBEMOOT_*`` env of its Deployment are written when they change.
* CrewSchedulingPolicy: ``PolicyValid`` and ``Scheduled`` conditions, and
  ``FailedScheduling`` events for zero matches.

Requeueing is state-driven: a change re-schedules exactly the Agents it affects
(:mod:`kubemoot.operator.view`). This package is an adapter: nothing else imports it.
"""

from __future__ import annotations

from kubemoot.operator.handlers import build_registry
from kubemoot.operator.kube import KubeClient, KubeError
from kubemoot.operator.reconciler import Reconciler
from kubemoot.operator.run import OperatorOptions, cluster_login, kopf_settings, run_operator, serve

__all__ = [
    "KubeClient",
    "KubeError",
    "OperatorOptions",
    "Reconciler",
    "build_registry",
    "cluster_login",
    "kopf_settings",
    "run_operator",
    "serve",
]
