"""Operator-side scheduling: filter → score → topology spread → bind.

This package is purely computational: it reads the custom resources of
:mod:`kubemoot.api`, decides with the engine of :mod:`kubemoot.gates`, and returns
values. No I/O, no clock reads (``now`` is a parameter), no module state. The
operator and ``kubemoot schedule`` call the same entry points:

* :func:`schedule_bundle` — one pass over every Agent of a bundle or snapshot;
* :class:`SchedulingPass` / :func:`schedule_agent` — Agent by Agent;
* :class:`AgentRoster` — Agents filed for a pass, kept between passes by a caller that
  tells it of each change.

Plugins (one gate or scorer per module) live in :mod:`kubemoot.scheduling.plugins`;
the framework that orders, caches and weighs them in :mod:`.framework`.
"""

from __future__ import annotations

from kubemoot.scheduling.archetypes import CONSENT_3, DEFAULT_ARCHETYPE, builtin_archetypes
from kubemoot.scheduling.bias import effective_bias, latency_tier_score, parse_bias
from kubemoot.scheduling.bind import (
    ENV_CANDIDATES,
    ENV_MODEL,
    ENV_MODEL_ENDPOINT,
    ENV_MODEL_SIZES,
    ENV_TRIAGE_ENDPOINT,
    ENV_TRIAGE_MODEL_ID,
)
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.framework import SCHEDULER_VERSION, SCORING_POLICY_VERSION, Framework
from kubemoot.scheduling.result import (
    AgentResult,
    PhaseResult,
    PolicyResult,
    ScheduleResult,
    SchedulingEvent,
)
from kubemoot.scheduling.roster import AgentRoster
from kubemoot.scheduling.scheduler import SchedulingPass, schedule_agent, schedule_bundle
from kubemoot.scheduling.snapshot import ClusterSnapshot, PolicyResolution

__all__ = [
    "CONSENT_3",
    "DEFAULT_ARCHETYPE",
    "ENV_CANDIDATES",
    "ENV_MODEL",
    "ENV_MODEL_ENDPOINT",
    "ENV_MODEL_SIZES",
    "ENV_TRIAGE_ENDPOINT",
    "ENV_TRIAGE_MODEL_ID",
    "SCHEDULER_VERSION",
    "SCORING_POLICY_VERSION",
    "AgentResult",
    "AgentRoster",
    "ClusterSnapshot",
    "Framework",
    "PhaseResult",
    "Placement",
    "PolicyResolution",
    "PolicyResult",
    "ScheduleResult",
    "SchedulingEvent",
    "SchedulingPass",
    "builtin_archetypes",
    "effective_bias",
    "latency_tier_score",
    "parse_bias",
    "schedule_agent",
    "schedule_bundle",
]
