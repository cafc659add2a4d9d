"""An UNSCHEDULABLE phase on the cluster path, through the real operator (issue 23 item 2).

The setting of ``test_cluster_e2e``: kmock for the API server with the operator on it, a
real ``nats-server``, two emulated GPUs, the crew of ``deploy/crew``. A policy edit
leaves the crew's mulling phase with no Model to match. The operator must take the
phase's binding out of every Deployment's env and put the FailedScheduling reason in
its place; ``kubemoot agent`` processes started from that env (as the rolled Pods would
be) make no LLM call at all — the emulators receive none — and the crew's answer
(``kubemoot ask -o json``) carries the reason. The second time: the policy restored,
the binding comes back, and the same crew answers with calls on the GPUs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.crew.test_cluster_e2e import (
    AGENTS,
    CREW,
    FAST_ENV,
    KUBEMOOT,
    NS,
    QUESTION,
    ClusterPath,
    cluster_path,
    container_env,
    manifests,
    nats_url,
)
from tests.crew.test_stable_bindings_e2e import start
from tests.operator.conftest import eventually, settle

__all__ = ["nats_url"]  # the fixture, re-exported for pytest

pytestmark = pytest.mark.nats

POLICY = "homelab-pilot-default"
REASON = "KUBEMOOT_MODEL_UNSCHEDULABLE_REASON"
TRIAGE_REASON = "KUBEMOOT_TRIAGE_MODEL_UNSCHEDULABLE_REASON"
BINDING = ("KUBEMOOT_MODEL_MODEL", "KUBEMOOT_MODEL_ENDPOINT",
           "KUBEMOOT_MODEL_CANDIDATES_MULLING")


def shipped_rules() -> list[dict[str, Any]]:
    (policy,) = manifests("deploy/crew/policy.yaml")
    rules: list[dict[str, Any]] = policy["spec"]["rules"]
    return rules


async def set_rules(path: ClusterPath, **require: dict[str, Any]) -> None:
    """`kubectl edit` of the crew's policy: each phase named requires what it is given,
    the others keep the shipped rule."""
    rules = [dict(rule, require=require[rule["phase"]]) if rule["phase"] in require
             else rule for rule in shipped_rules()]
    await path.cluster.patch("CrewSchedulingPolicy", POLICY, {"spec": {"rules": rules}},
                             namespace=NS)


def envs(path: ClusterPath) -> dict[str, dict[str, str]]:
    return {name: container_env(path.cluster, name) for name in AGENTS}


async def ask(path: ClusterPath) -> tuple[int, dict[str, Any]]:
    """`kubemoot ask -o json`; its exit status (1: the crew could not answer) and answer."""
    asked = await asyncio.create_subprocess_exec(
        str(KUBEMOOT), "ask", "--crew", f"{NS}/{CREW}", "--nats", path.nats_url,
        "-o", "json", QUESTION, env={**path.base, **FAST_ENV},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(asked.communicate(), 90.0)
    assert asked.returncode in (0, 1), err.decode() + out.decode()
    answer: dict[str, Any] = json.loads(out)
    return asked.returncode, answer


def generation_requests(path: ClusterPath) -> dict[str, list[str]]:
    """What each emulated GPU was asked to generate (path and model), oldest first."""
    return {name: [f"{r.path} {r.model}" for r in gpu.records]
            for name, gpu in path.gpus.items()}


async def restart_all(path: ClusterPath, tmp_path: Path) -> None:
    """The rolled Pods: every agent process stopped and started from its new env."""
    await path.stop_all()
    path.agents.clear()
    await asyncio.gather(*(start(path, name, tmp_path / f"{name}.ready")
                           for name in AGENTS))


NO_SUCH_MODEL = {"matchLabels": {"family": "llama"}}


async def test_a_policy_edit_that_leaves_a_phase_unschedulable_stops_its_llm_calls(
    kmock: Any, nats_url: str, tmp_path: Path,
) -> None:
    async with cluster_path(kmock, nats_url) as path:
        # 1. Mulling has no Model left to match; triage is still bound.
        await set_rules(path, mulling=NO_SUCH_MODEL)
        await eventually(lambda: all(REASON in env and not set(BINDING) & set(env)
                                     for env in envs(path).values()),
                         what="every Deployment trading its binding for the reason")
        await settle(path.cluster)
        mulling_only = envs(path)
        await restart_all(path, tmp_path)
        code, first = await ask(path)
        after_first = generation_requests(path)

        # 2. Triage too: nothing is left to call at all.
        await set_rules(path, mulling=NO_SUCH_MODEL, triage=NO_SUCH_MODEL)
        await eventually(lambda: all(TRIAGE_REASON in env for env in envs(path).values()),
                         what="the triage reason in every Deployment")
        await settle(path.cluster)
        both = envs(path)
        await restart_all(path, tmp_path)
        code2, second = await ask(path)
        after_second = generation_requests(path)

        # 3. The second time: the policy as shipped, the binding back, calls on the GPUs.
        await set_rules(path)
        await eventually(lambda: not any(REASON in env or TRIAGE_REASON in env
                                         for env in envs(path).values()),
                         what="the reasons removed")
        await settle(path.cluster)
        rebound = envs(path)
        await restart_all(path, tmp_path)
        _, third = await ask(path)

    # What the operator left in the Deployments: the reason, in kube-scheduler's words.
    (reason,) = {env[REASON] for env in mulling_only.values()}
    assert reason.startswith("0/4 models are available for phase mulling:"), reason
    assert "didn't match require selector" in reason
    triage_model = {env["KUBEMOOT_TRIAGE_MODEL_MODEL_ID"] for env in mulling_only.values()}
    # 1. No mulling call was attempted: the only calls are the coordinator's triage,
    #    and the GPUs received exactly those (on the triage model), nothing else.
    assert {(c["agent"], c["phase"]) for c in first["calls"]} <= {
        (f"{NS}/coordinator", "triage")}, first["calls"]
    sent = [r for records in after_first.values() for r in records]
    assert len(sent) == len(first["calls"]), (after_first, first["calls"])
    assert {r.split(" ", 1)[1] for r in sent} <= triage_model, after_first
    # ... and the crew's answer says why, with the FailedScheduling reason.
    aside = [s for s in first["signals"] if s["type"] == "stand_aside"]
    assert len(aside) == 2 and all(
        s["content"] == reason and s["metadata"]["reason"] == "unschedulable"
        for s in aside), first["signals"]
    assert reason in first["answer"], first["answer"]
    assert code == 1 and first["answered"] is False and \
        first["settlement"] == "unschedulable", first

    # 2. Both phases unschedulable: no LLM call at all, the emulators saw nothing new.
    assert all(not {k for k in env if k.startswith("KUBEMOOT_TRIAGE_MODEL_MODEL")}
               for env in both.values()), both
    assert second["calls"] == [] and after_second == after_first, (second, after_second)
    assert reason in second["answer"] and code2 == 1, second

    # 3. Bound again: the same crew answers with calls on the GPUs.
    assert all(env["KUBEMOOT_MODEL_MODEL"] for env in rebound.values())
    assert third["answered"] is True, third
    assert third["calls"] and {c["provider"] for c in third["calls"]} <= set(path.gpus)
