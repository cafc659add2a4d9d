"""The capability gates of one PlacementRequest.

Each gate reads only *declared capability evidence* of a node (``accelerator``,
``memoryGiB``, ``runtimes``, ``artifacts``, ``license``, ``policy``). Labels and
telemetry are never read here: a friendly label or an idle GPU proves nothing about
memory, digest, runtime or clearance. An absent field is UNKNOWN.

Freshness: a node's evidence is judged against ``spec.now``. When it is older than
``freshness.maxAgeSeconds`` every capability gate of that node reports STALE — a PASS
*and* a FAIL: outdated evidence can neither qualify a node nor rule it out for good
(so the outcome is DEFER rather than UNSCHEDULABLE when only stale nodes remain). What
the stale evidence said is kept in the result's evidence as ``verdictIfFresh``. A node
without ``observedAt`` keeps its gate verdicts, and the ``freshness`` gate reports
UNKNOWN: its age cannot be shown, so it cannot be feasible, but a declared violation
still rules it out.

The classes are named ``Node…Gate`` because they judge a node of a PlacementRequest;
the scheduling plugins that judge a (Model, ModelProvider) pair keep the bare names
(``kubemoot.scheduling.plugins.RuntimeGate`` and the rest). The ``name`` strings in the
records are unchanged: lower-case here, capitalised there, and the two records never meet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubemoot.capability.model import ArtifactReplica, NodeEvidence, Workload
from kubemoot.gates import Gate, GateResult, Verdict

__all__ = [
    "GATE_FIELDS",
    "NodeAcceleratorGate",
    "NodeArtifactGate",
    "NodeCandidate",
    "NodeFreshnessGate",
    "NodeLicenseGate",
    "NodeMemoryGate",
    "NodePolicyGate",
    "NodeRuntimeGate",
    "capability_gates",
    "has_verified_replica",
    "rfc3339",
]

# The node field each gate reads: named in UNKNOWN reasons and recheck triggers.
GATE_FIELDS: dict[str, str] = {
    "artifact": "artifacts",
    "runtime": "runtimes",
    "accelerator": "accelerator",
    "memory": "memoryGiB",
    "license": "license",
    "policy": "policy.egress",
    "freshness": "observedAt",
}

_LICENSE_RANK = {"BLOCKED": 0, "REVIEW_REQUIRED": 1, "ALLOW": 2}


def rfc3339(moment: datetime) -> str:
    """``2026-05-15T12:00:00Z`` form for records."""
    return moment.isoformat().replace("+00:00", "Z")


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


@dataclass(frozen=True, slots=True)
class NodeCandidate:
    """A node with the age of its evidence at the decision's ``now``."""

    node: NodeEvidence
    age_seconds: float | None
    max_age_seconds: float

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def stale(self) -> bool:
        return self.age_seconds is not None and self.age_seconds > self.max_age_seconds

    @property
    def observed_at(self) -> str | None:
        observed = self.node.observed_at
        return None if observed is None else rfc3339(observed)

    @classmethod
    def at(cls, node: NodeEvidence, *, now: datetime, max_age_seconds: float) -> NodeCandidate:
        age = None if node.observed_at is None else (now - node.observed_at).total_seconds()
        return cls(node, age, max_age_seconds)


def has_verified_replica(node: NodeEvidence, workload: Workload) -> bool:
    """True when the node holds the exact digest of the workload's artifact, VERIFIED."""
    artifact = workload.artifact
    if artifact is None or not node.artifacts:
        return False
    return any(
        r.digest == artifact.digest and r.state.upper() == "VERIFIED" for r in node.artifacts
    )


class _CapabilityGate:
    """Shared shape: judge the node's evidence, then apply the freshness rule."""

    name = ""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def check(self, candidate: NodeCandidate, /) -> GateResult:
        result = self.judge(candidate.node)
        observed = candidate.observed_at
        if candidate.stale and result.result is not Verdict.UNKNOWN:
            return GateResult.stale(
                self.name,
                f"evidence is {candidate.age_seconds:.0f} s old (max "
                f"{_num(candidate.max_age_seconds)} s); when fresh it said "
                f"{result.result.value}: {result.reason}",
                observed_at=observed,
                verdictIfFresh=result.result.value,
                ageSeconds=_num(round(candidate.age_seconds or 0.0, 3)),
                maxAgeSeconds=_num(candidate.max_age_seconds),
                **result.evidence,
            )
        if observed is None:
            return result
        return GateResult(self.name, result.result, result.reason, result.evidence, observed)

    def judge(self, node: NodeEvidence) -> GateResult:
        raise NotImplementedError

    def _missing(self, node: NodeEvidence) -> GateResult:
        field = GATE_FIELDS[self.name]
        return GateResult.unknown(self.name, f"{node.name} declares no {field}", missingField=field)


class NodeArtifactGate(_CapabilityGate):
    """Exact digest and replica state; DESIGN §8.

    No artifact list at all → UNKNOWN; no replica of the artifact → PASS without
    locality (it will be transferred); every replica of it exact and VERIFIED → PASS
    with locality; a QUARANTINED replica, a digest mismatch, or any other state (unknown
    provenance) → FAIL. A replica matches by artifact name or by digest.
    """

    name = "artifact"

    def judge(self, node: NodeEvidence) -> GateResult:
        artifact = self.workload.artifact
        if artifact is None:
            return GateResult.pass_(self.name, "the workload names no artifact", locality=False)
        required = {"name": artifact.name, "digest": artifact.digest}
        if node.artifacts is None:
            return GateResult.unknown(
                self.name,
                f"{node.name} lists no artifacts, so its replica state is unknown",
                required=required,
                missingField="artifacts",
            )
        replicas = [
            r for r in node.artifacts if r.name == artifact.name or r.digest == artifact.digest
        ]
        found = [r.model_dump() for r in replicas]
        if not replicas:
            return GateResult.pass_(
                self.name,
                f"no replica of {artifact.name} on {node.name}; it will be transferred",
                required=required,
                locality=False,
            )
        problems = [p for p in (_replica_problem(r, artifact.digest) for r in replicas) if p]
        if problems:
            return GateResult.fail(
                self.name, "; ".join(problems), required=required, replicas=found
            )
        return GateResult.pass_(
            self.name,
            f"verified local replica of {artifact.name}@{artifact.digest}",
            required=required,
            replicas=found,
            locality=True,
        )


def _replica_problem(replica: ArtifactReplica, digest: str) -> str | None:
    label = f"replica {replica.name}@{replica.digest}"
    if replica.digest != digest:
        return f"{label} does not match required digest {digest}"
    state = replica.state.upper()
    if state == "QUARANTINED":
        return f"{label} is QUARANTINED"
    if state != "VERIFIED":
        return f"{label} has unverified provenance (state {replica.state})"
    return None


class NodeRuntimeGate(_CapabilityGate):
    """The workload's runtime profile must be among the node's declared runtimes."""

    name = "runtime"

    def judge(self, node: NodeEvidence) -> GateResult:
        required = self.workload.runtime
        if required is None:
            return GateResult.pass_(self.name, "the workload names no runtime")
        if node.runtimes is None:
            return self._missing(node)
        evidence: dict[str, Any] = {"required": required, "declared": list(node.runtimes)}
        if required in node.runtimes:
            return GateResult.pass_(self.name, f"runtime {required} declared", **evidence)
        shown = ", ".join(node.runtimes) or "none"
        return GateResult.fail(
            self.name, f"runtime {required} not among declared runtimes ({shown})", **evidence
        )


class NodeAcceleratorGate(_CapabilityGate):
    """The node's declared accelerator type must be one the workload accepts.

    Compared case-insensitively. A label such as ``accelerator: h100`` never counts.
    """

    name = "accelerator"

    def judge(self, node: NodeEvidence) -> GateResult:
        accepted = self.workload.accelerators
        if accepted is None:
            return GateResult.pass_(self.name, "the workload names no accelerator")
        if node.accelerator is None:
            return self._missing(node)
        evidence: dict[str, Any] = {"required": list(accepted), "declared": node.accelerator}
        if node.accelerator.casefold() in {a.casefold() for a in accepted}:
            return GateResult.pass_(
                self.name, f"{node.accelerator} is a compatible accelerator", **evidence
            )
        return GateResult.fail(
            self.name,
            f"{node.accelerator} is not one of {', '.join(accepted)}",
            **evidence,
        )


class NodeMemoryGate(_CapabilityGate):
    """Admission-safe device memory must cover the workload's requirement."""

    name = "memory"

    def judge(self, node: NodeEvidence) -> GateResult:
        required = self.workload.memory_gib
        if required is None:
            return GateResult.pass_(self.name, "the workload names no memory requirement")
        if node.memory_gib is None:
            return self._missing(node)
        have, need = _num(node.memory_gib), _num(required)
        evidence: dict[str, Any] = {"requiredGiB": need, "declaredGiB": have}
        if node.memory_gib >= required:
            return GateResult.pass_(self.name, f"{have} GiB ≥ {need} GiB required", **evidence)
        return GateResult.fail(self.name, f"{have} GiB < {need} GiB required", **evidence)


class NodeLicenseGate(_CapabilityGate):
    """The node's license state for the artifact must be ALLOW.

    A workload can only require ALLOW (its contract refuses anything weaker), so a node
    in REVIEW_REQUIRED or BLOCKED fails, whatever its score would be.
    """

    name = "license"

    def judge(self, node: NodeEvidence) -> GateResult:
        required = self.workload.license
        if node.license is None:
            return self._missing(node)
        evidence: dict[str, Any] = {"required": required, "declared": node.license}
        if node.license != "BLOCKED" and _LICENSE_RANK[node.license] >= _LICENSE_RANK[required]:
            return GateResult.pass_(self.name, f"license state {node.license}", **evidence)
        return GateResult.fail(
            self.name, f"license state {node.license}, {required} required", **evidence
        )


class NodePolicyGate(_CapabilityGate):
    """A workload that must not reach the outside cannot run where egress is allowed."""

    name = "policy"

    def judge(self, node: NodeEvidence) -> GateResult:
        policy = self.workload.policy
        if policy is None or policy.egress != "none":
            return GateResult.pass_(self.name, "the workload sets no egress restriction")
        declared = node.policy.egress if node.policy is not None else None
        if declared is None:
            return self._missing(node)
        evidence: dict[str, Any] = {"requiredEgress": "none", "declaredEgress": declared}
        if declared == "none":
            return GateResult.pass_(self.name, "node policy has no external egress", **evidence)
        return GateResult.fail(
            self.name, "no-egress workload, but node policy allows egress", **evidence
        )


class NodeFreshnessGate:
    """Is the node's evidence recent enough to decide on? PASS, STALE, or UNKNOWN."""

    name = "freshness"

    def check(self, candidate: NodeCandidate, /) -> GateResult:
        observed = candidate.observed_at
        limit = _num(candidate.max_age_seconds)
        if candidate.age_seconds is None:
            return GateResult.unknown(
                self.name,
                f"{candidate.name} has no observedAt; the age of its evidence is unknown",
                missingField="observedAt",
                maxAgeSeconds=limit,
            )
        age = _num(round(candidate.age_seconds, 3))
        evidence: dict[str, Any] = {"ageSeconds": age, "maxAgeSeconds": limit}
        if candidate.stale:
            return GateResult.stale(
                self.name,
                f"evidence is {age} s old, max {limit} s",
                observed_at=observed,
                **evidence,
            )
        if candidate.age_seconds < 0:
            # Evidence from "the future" is clock skew, not staleness: accept it as fresh.
            return GateResult.pass_(
                self.name,
                f"observed {-age} s after now (clock skew)",
                observed_at=observed,
                **evidence,
            )
        return GateResult.pass_(
            self.name,
            f"evidence is {age} s old, max {limit} s",
            observed_at=observed,
            **evidence,
        )


def capability_gates(workload: Workload) -> Sequence[Gate[NodeCandidate]]:
    """The gates in the order the record shows them."""
    return (
        NodeArtifactGate(workload),
        NodeRuntimeGate(workload),
        NodeAcceleratorGate(workload),
        NodeMemoryGate(workload),
        NodeLicenseGate(workload),
        NodePolicyGate(workload),
        NodeFreshnessGate(),
    )
