"""The Kubemoot operator: kopf handlers that keep a cluster's custom resources in step.

* ModelProvider: a probe loop (``--probe-interval``) writes ``status.ready``,
  ``status.lastProbedAt``, ``status.capacity`` and a ``Ready`` condition, and publishes
  the provider-state document to the shared KV for the agent runtime.
* Model: ``status.ready`` and ``status.footprintMiB`` from its provider's probe.
* Agent: scheduled with :mod:`kubemoot.scheduling`; ``status.scheduling``, conditions
  and the ``KUBEMOOT_*`` env of its Deployment are written when they change.
* CrewSchedulingPolicy: ``Valid`` and ``Scheduled`` conditions, and
  ``FailedScheduling`` events for zero matches.

* Deployments of the crews' namespaces are watched (:mod:`kubemoot.operator.watch`),
  so one created after its Agent was bound gets the env at once.

Requeueing is state-driven: a change re-schedules exactly the Agents it affects
(:mod:`kubemoot.operator.view`), including the recheck triggers a decision names: a
refreshed probe, a freed slot. This package is an adapter: nothing else imports it.
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
