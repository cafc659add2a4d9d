"""The discrete-event simulator: the production runtime against the usual routers.

A scenario (:mod:`~kubemoot.sim.scenario`) describes a fleet of emulated GPUs
(:mod:`~kubemoot.sim.gpu`, Ollama-like engines) and crews whose discussions make a
seeded trace (:mod:`~kubemoot.sim.workload`). :func:`simulate` runs every policy on the
same trace in virtual time (:mod:`~kubemoot.sim.vloop`): ``kubemoot`` is the unchanged
per-call runtime on the embedded store; the baselines (:mod:`~kubemoot.sim.policies`)
are static binding, round-robin, least-busy, random and a herd-like score. Results are
compared with a lower bound on mean wait (:mod:`~kubemoot.sim.bound`) and written as
report.json and plots (:mod:`~kubemoot.sim.report`).
"""

from __future__ import annotations

from kubemoot.sim.bound import LowerBound, lower_bound
from kubemoot.sim.scenario import Scenario, load_scenario, parse_scenario
from kubemoot.sim.simulation import POLICY_NAMES, PolicyRun, SimulationResult, simulate
from kubemoot.sim.workload import Trace, build_trace

__all__ = [
    "POLICY_NAMES",
    "LowerBound",
    "PolicyRun",
    "Scenario",
    "SimulationResult",
    "Trace",
    "build_trace",
    "load_scenario",
    "lower_bound",
    "parse_scenario",
    "simulate",
]
