"""Table tests: one row per gate behaviour, each judged on one (Model, provider) candidate."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kubemoot.api import ModelProvider
from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins import (
    JUDGED,
    DigestGate,
    EgressGate,
    FreshnessGate,
    JudgedGate,
    LicenseGate,
    ModelReadyGate,
    ParallelismGate,
    PluginArgs,
    ProviderReadyGate,
    RequireGate,
    SpreadContext,
    TopologySpreadGate,
    VramGate,
)
from kubemoot.testing.builders import model, provider, rule

from .conftest import NOW

P, F, U, S = Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN, Verdict.STALE
TOOLS = {"capability/tool-calling": "true", "params": "32B"}


def cand(m: object = None, p: ModelProvider | str | None = "default") -> Placement:
    chosen_model = m if m is not None else model("qwen3-32b", vram_mib=20480, labels=TOOLS)
    chosen_provider = provider("ollama-a", vram_total_mib=32768) if p == "default" else p
    assert not isinstance(chosen_provider, str)
    return Placement(chosen_model, chosen_provider)  # type: ignore[arg-type]


def verdict(gate: JudgedGate, candidate: Placement) -> Verdict:
    """The gate's verdict, after checking that judging alone gives the same one.

    A pass judges the provider-tier gates of every Model and makes their results (reason,
    evidence) only when a record reads them, so the two must never disagree.
    """
    result = gate.check(candidate)
    assert gate.judge(candidate) is result.result
    assert not result.admits_unknown  # the pass's standing rule for judged gates
    return result.result


def fresh(**kw: object) -> ModelProvider:
    return provider("ollama-a", last_probed_at=NOW - timedelta(seconds=30), **kw)  # type: ignore[arg-type]


def stale(**kw: object) -> ModelProvider:
    return provider("ollama-a", last_probed_at=NOW - timedelta(seconds=600), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "gate_rule", "labels", "want"),
    [
        ("labels match", rule("mulling", require=TOOLS), TOOLS, P),
        ("label missing", rule("mulling", require=TOOLS), {"params": "32B"}, F),
        ("no require admits all", rule("mulling"), {}, P),
        ("no rule admits all", None, {}, P),
        ("empty selector admits all", rule("mulling", require={}), {"a": "b"}, P),
    ],
)
def test_require(name: str, gate_rule: object, labels: dict[str, str], want: Verdict) -> None:
    gate = RequireGate(gate_rule)  # type: ignore[arg-type]
    assert gate.check(cand(model("qwen3-32b", labels=labels))).result is want, name


@pytest.mark.parametrize(
    ("name", "ready", "want"),
    [("no status is Ready", None, P), ("ready", True, P), ("not ready", False, F)],
)
def test_model_ready(name: str, ready: bool | None, want: Verdict) -> None:
    assert verdict(ModelReadyGate(), cand(model("qwen3-32b", ready=ready))) is want, name


@pytest.mark.parametrize(
    ("name", "the_provider", "want"),
    [
        ("ready", provider("ollama-a"), P),
        ("missing provider", None, F),
        ("readiness unknown", provider("ollama-a", ready=None), U),
        ("not ready", provider("ollama-a", ready=False), F),
        ("not ready but stale", stale(ready=False), S),
        ("not ready, fresh", fresh(ready=False), F),
    ],
)
def test_provider_ready(name: str, the_provider: ModelProvider | None, want: Verdict) -> None:
    gate = ProviderReadyGate(now=NOW, max_age_seconds=120)
    assert verdict(gate, cand(p=the_provider)) is want, name


@pytest.mark.parametrize(
    ("name", "the_provider", "max_age", "want"),
    [
        ("declared by hand", provider("ollama-a"), 120, P),
        ("fresh", fresh(), 120, P),
        ("stale", stale(), 120, S),
        ("stale under a longer limit is fresh", stale(), 900, P),
        ("no provider", None, 120, U),
    ],
)
def test_freshness(
    name: str, the_provider: ModelProvider | None, max_age: int, want: Verdict
) -> None:
    gate = FreshnessGate(now=NOW, max_age_seconds=max_age)
    assert verdict(gate, cand(p=the_provider)) is want, name


@pytest.mark.parametrize(
    ("name", "vram_mib", "the_provider", "want"),
    [
        ("fits with reserve", 20480, provider("a", vram_total_mib=32768), P),
        ("exactly fits", 31744, provider("a", vram_total_mib=32768), P),
        ("reserve tips it over", 31745, provider("a", vram_total_mib=32768), F),
        ("custom reserve", 31745, provider("a", vram_total_mib=32768, reserve_mib=0), P),
        ("unknown total", 20480, provider("a", vram_total_mib=None), U),
        ("unknown footprint", None, provider("a", vram_total_mib=32768), U),
        (
            "observed beats declared",
            1000,
            provider("a", vram_total_mib=24576, loaded=[("qwen3:32b", 27648)]),
            F,
        ),
        (
            "observed footprint known",
            None,
            provider("a", vram_total_mib=32768, loaded=[("qwen3:32b", 27648)]),
            P,
        ),
        ("too big on a stale status", 40000, stale(vram_total_mib=32768), S),
        ("no provider", 20480, None, U),
    ],
)
def test_vram(
    name: str, vram_mib: int | None, the_provider: ModelProvider | None, want: Verdict
) -> None:
    gate = VramGate(now=NOW, max_age_seconds=120)
    assert verdict(gate, cand(model("qwen3-32b", vram_mib=vram_mib), the_provider)) is want, name


@pytest.mark.parametrize(
    ("name", "max_parallel", "agent_count", "assumed", "want"),
    [
        ("room", 1, 0, 0, P),
        ("last slot", 1, 3, 0, P),
        ("full by status", 1, 4, 0, F),
        ("full by assumed bindings", 1, 1, 3, F),
        ("assumed leaves room", 2, 1, 3, P),
        ("unknown maxParallel", None, 0, 0, U),
        ("missing agentCount counts as 0", 1, None, 0, P),
    ],
)
def test_parallelism(
    name: str, max_parallel: int | None, agent_count: int | None, assumed: int, want: Verdict
) -> None:
    the_provider = provider("ollama-a", max_parallel=max_parallel, agent_count=agent_count)
    gate = ParallelismGate(
        now=NOW, max_age_seconds=120, concurrency_factor=4, assumed={"ollama-a": assumed}
    )
    assert verdict(gate, cand(p=the_provider)) is want, name


def test_parallelism_falls_back_to_num_parallel() -> None:
    the_provider = provider("ollama-a", max_parallel=None, num_parallel=2, agent_count=7)
    gate = ParallelismGate(now=NOW, max_age_seconds=120, concurrency_factor=4, assumed={})
    assert verdict(gate, cand(p=the_provider)) is P


@pytest.mark.parametrize(
    ("name", "license_state", "want"),
    [
        ("undeclared", None, P),
        ("allow", "ALLOW", P),
        ("review", "REVIEW_REQUIRED", F),
        ("blocked", "BLOCKED", F),
    ],
)
def test_license(name: str, license_state: str | None, want: Verdict) -> None:
    the_model = model("qwen3-32b", license=license_state)
    assert verdict(LicenseGate(), cand(the_model)) is want, name


@pytest.mark.parametrize(
    ("name", "model_egress", "provider_egress", "want"),
    [
        ("no constraint", None, None, P),
        ("allowed model anywhere", "allowed", "allowed", P),
        ("none on none", "none", "none", P),
        ("none on allowed", "none", "allowed", F),
        ("none on undeclared", "none", None, U),
    ],
)
def test_egress(
    name: str, model_egress: str | None, provider_egress: str | None, want: Verdict
) -> None:
    extra = {} if provider_egress is None else {"policy": {"egress": provider_egress}}
    the_provider = provider("ollama-a", **extra)  # type: ignore[arg-type]
    the_model = model("qwen3-32b", egress=model_egress)
    assert verdict(EgressGate(), cand(the_model, the_provider)) is want, name


@pytest.mark.parametrize(
    ("name", "digest", "the_provider", "want", "local"),
    [
        ("unpinned", None, provider("a"), P, None),
        ("quarantined", "sha256:d", provider("a", quarantined_digests=["sha256:d"]), F, None),
        ("held", "sha256:d", provider("a", digests=["sha256:d"]), P, True),
        ("not held: pulled", "sha256:d", provider("a", digests=["sha256:x"]), P, False),
        ("nothing reported", "sha256:d", provider("a"), P, False),
        (
            "loaded with another digest",
            "sha256:d",
            provider("a", loaded=[{"name": "qwen3:32b", "digest": "sha256:x"}]),
            F,
            None,
        ),
        ("no provider", "sha256:d", None, U, None),
    ],
)
def test_digest(
    name: str,
    digest: str | None,
    the_provider: ModelProvider | None,
    want: Verdict,
    local: bool | None,
) -> None:
    candidate = cand(model("qwen3-32b", digest=digest), the_provider)
    assert verdict(DigestGate(), candidate) is want, name
    result: GateResult = DigestGate().check(candidate)
    if local is not None:
        assert result.evidence["local"] is local


@pytest.mark.parametrize(
    ("name", "mode", "used", "alternatives", "want"),
    [
        ("no spread", "ScheduleAnyway", frozenset(), True, P),
        ("other provider used", "ScheduleAnyway", frozenset({"ollama-b"}), True, P),
        ("same provider, alternatives", "ScheduleAnyway", frozenset({"ollama-a"}), True, F),
        ("same provider, falls back", "ScheduleAnyway", frozenset({"ollama-a"}), False, P),
        ("DoNotSchedule", "DoNotSchedule", frozenset({"ollama-a"}), False, F),
    ],
)
def test_topology_spread(
    name: str, mode: str, used: frozenset[str], alternatives: bool, want: Verdict
) -> None:
    spread = SpreadContext("provider", mode, used, alternatives)
    assert verdict(TopologySpreadGate(spread), cand()) is want, name


def _with_version(version: str | None, **spec: object) -> ModelProvider:
    base = provider("ollama-a", **spec)  # type: ignore[arg-type]
    assert base.status is not None
    status = base.status.model_copy(update={"runtime_version": version})
    return base.model_copy(update={"status": status})


@pytest.mark.parametrize(
    ("name", "runtime", "version", "want"),
    [
        ("no requirement", None, None, P),
        ("met", "ollama>=0.6", "0.6.2", P),
        ("met with a suffix", "ollama>=0.6", "0.7.0-rc1", P),
        ("too old", "ollama>=0.6", "0.5.13", F),
        ("range upper bound", "ollama>=0.6,<0.8", "0.8.0", F),
        ("range inside", "ollama>=0.6,<0.8", "0.7.1", P),
        ("any version", "ollama", "0.1.0", P),
        ("version not reported", "ollama>=0.6", None, U),
        ("version not dotted", "ollama>=0.6", "main", U),
        ("another engine", "vllm>=0.6", "0.9.0", F),
    ],
)
def test_runtime(name: str, runtime: str | None, version: str | None, want: Verdict) -> None:
    from kubemoot.scheduling.plugins import RuntimeGate

    the_model = model("qwen3-32b", runtime=runtime)
    result = RuntimeGate().check(cand(the_model, _with_version(version)))
    assert verdict(RuntimeGate(), cand(the_model, _with_version(version))) is want, (
        name, result.reason
    )


def test_runtime_requirement_that_does_not_parse_names_the_field() -> None:
    from kubemoot.api import InputError, parse_manifest

    document = model("qwen3-32b").to_manifest()
    document["spec"]["runtime"] = "ollama>>0.6"
    with pytest.raises(InputError) as caught:
        parse_manifest(document)
    message = caught.value.describe()
    assert "spec.runtime" in message and "not a version constraint" in message


_SPECS: list[dict[str, object]] = [
    {},
    {"vram_mib": None, "ready": False, "license": "BLOCKED", "egress": "none",
     "runtime": "ollama>=0.6", "digest": "sha256:d"},
    {"vram_mib": 40000, "ready": True, "license": "ALLOW", "egress": "none",
     "runtime": "vllm>=0.6", "digest": "sha256:x"},
]
_PROVIDERS: list[ModelProvider | None] = [
    None,
    provider("ollama-a", vram_total_mib=32768),
    provider("ollama-a", ready=None, vram_total_mib=None, max_parallel=None, agent_count=None),
    stale(ready=False, vram_total_mib=32768, max_parallel=1, agent_count=9,
          quarantined_digests=["sha256:d"]),
    fresh(ready=False, vram_total_mib=32768, max_parallel=1, agent_count=3,
          loaded=[{"name": "qwen3:32b", "digest": "sha256:d", "sizeMiB": 30000}],
          policy={"egress": "allowed"}),
    _with_version("0.5.1", policy={"egress": "none"}, digests=["sha256:x"]),
    ModelProvider.model_validate(
        {"metadata": {"name": "ollama-a"}, "spec": {"endpoint": "http://ollama-a:11434"}}
    ),
]


@pytest.mark.parametrize("name", list(JUDGED))
def test_every_judged_gate_judges_as_it_checks(name: str) -> None:
    args = PluginArgs(now=NOW, max_age_seconds=120, assumed={"ollama-a": 2})
    seen: set[Verdict] = set()
    for spec in _SPECS:
        for the_provider in _PROVIDERS:
            seen.add(verdict(JUDGED[name](args), cand(model("qwen3-32b", **spec), the_provider)))
    assert len(seen) > 1, name  # the grid reaches more than one branch of every gate
